"""Data for attnseq: synthetic tasks with gold alignments, TSV corpora, vocabularies, batching.

Names are imported on first use: the model library, which needs the vocabulary's special tokens,
does not pull Lightning in, nor does evaluation (``Seq2SeqData``; only training's ``Seq2SeqDataModule``
imports it), and the tasks' settings (``attnseq.data.tasks``) are read without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "NO_ALIGNMENT": "batch", "Batch": "batch", "collate": "batch", "DataError": "errors",
    "EncodedExample": "example", "Example": "example", "encode_examples": "example",
    "filter_by_source_length": "lengths", "validate_length_range": "lengths", "EpochPermutationSampler": "sampler",
    "LengthBucketBatchSampler": "sampler", "padding_fraction": "sampler", "split_examples": "splits",
    "DICTIONARY": "tasks", "TASKS": "tasks", "generate": "tasks", "make_task": "tasks", "symbol_tokens": "tasks",
    "SPACE_TOKEN": "tokenizers", "TOKENIZERS": "tokenizers", "tokenize": "tokenizers", "read_tsv": "tsv",
    "BOS": "vocab", "EOS": "vocab", "PAD": "vocab", "SPECIAL_TOKENS": "vocab", "UNK": "vocab",
    "Vocabulary": "vocab", "DATA_TASKS": "corpus", "Seq2SeqData": "corpus", "Seq2SeqDataModule": "datamodule",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"attnseq.data.{_HOMES[name]}"), name)
