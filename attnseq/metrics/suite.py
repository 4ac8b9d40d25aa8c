"""One metrics suite for validation, test and evaluation, built from registered metrics.

A metric, or a family of metrics that share their sums, is a class that registers itself by
subclassing ``SuiteMetric`` with a ``name``, and declares on the class what it needs (attention,
a gold alignment, sentences, the counterfactual replays), the stages it reports in and which of
its names are better lower. ``MetricSuite(spec)`` holds the registered metrics the run described
by ``spec`` can report; the LightningModule (``val/``, ``test/``) and ``evaluate.py``'s evaluator
(``eval/``) each feed it ``BatchOutputs`` and read ``compute()``. ``names(spec)`` (what a
monitor may name) is derived from the same classes, torch-free (``attnseq.metrics.declarations``).
"""

from __future__ import annotations

from dataclasses import replace

from torch import Tensor, nn

from attnseq.metrics import families  # noqa: F401 - the built-in metrics' implementations register
from attnseq.metrics.declarations import (
    FIT_STAGES,
    METRICS,
    SuiteSpec,
    applicable,
    lower_is_better,
    names,
)
from attnseq.metrics.members import BatchOutputs, SuiteMetric

__all__ = ["FIT_STAGES", "METRICS", "BatchOutputs", "MetricSuite", "SuiteMetric", "SuiteSpec", "lower_is_better",
           "names"]


class MetricSuite(nn.Module):
    """The registered metrics ``spec``'s run reports, fed together: ``update`` once per batch,
    ``compute`` (prefixed by the stage) and ``bucket_rows`` at the end, then ``reset``."""

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__()
        self.spec = spec
        computed = [cls for cls in applicable(spec) if not cls.kept_by_module]
        for cls in computed:
            if not issubclass(cls, SuiteMetric):
                raise TypeError(f"metric {cls.name!r} is declared, but no SuiteMetric subclass computes it")
        self.members = nn.ModuleDict({cls.name: cls(spec) for cls in computed})

    def names(self) -> list[str]:
        return names(self.spec)

    def lower_is_better(self, name: str) -> bool:
        return lower_is_better(name)

    def update(self, outputs: BatchOutputs) -> None:
        lo, hi = self.spec.train_lengths
        inside = (outputs.src_lengths >= lo) & (outputs.src_lengths <= hi)  # (B,)
        outputs = replace(outputs, inside=inside)
        for member in self.members.values():
            member.update(outputs)

    def update_faithfulness(self, records, alpha: float = 0.05) -> None:
        """The faithfulness probe's ``FaithRecords`` of some sequences (the caller's sample, not a batch the
        other metrics read); nothing when this suite does not report ``faith/...``."""
        if "faithfulness" in self.members:
            self.members["faithfulness"].add(records, alpha)

    def compute(self) -> dict[str, Tensor | float]:
        """Every member's values, named ``<stage>/<name>``."""
        stage = self.spec.stage
        return {
            f"{stage}/{name}": value for member in self.members.values() for name, value in member.compute().items()
        }

    def bucket_rows(self) -> list[dict]:
        """One row per length bucket: the accuracy's ``bucket_table`` and, in evaluation, every
        member's columns."""
        rows: list[dict] = []
        for member in self.members.values():
            columns = member.bucket_columns()
            if columns is None:
                continue
            if not rows:
                rows = [dict(row) for row in columns]
            else:
                for row, extra in zip(rows, columns, strict=True):
                    row.update(extra)
        return rows

    def reset(self) -> None:
        for member in self.members.values():
            member.reset()

