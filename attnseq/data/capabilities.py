"""What a task's data offers the metrics, read in one place (validation's metric names, the
LightningModule's and the evaluator's suites) until the tasks declare it on their classes."""

from __future__ import annotations

from attnseq.data.tokenizers import TEXT_TASKS


def has_gold_alignment(task: str) -> bool:
    """The examples carry a gold source position per target token (the synthetic tasks do; a TSV
    corpus does not)."""
    return task != "tsv"


def is_text(task: str) -> bool:
    """The outputs are sentences, scored by sacreBLEU and chrF."""
    return task in TEXT_TASKS
