"""Data for attnseq: synthetic tasks with gold alignments, TSV corpora, vocabularies, batching.

The Lightning data module (``Seq2SeqDataModule``, ``DATA_TASKS``) is imported on first use, so that
the model library, which needs the vocabulary's special tokens, does not pull Lightning in.
"""

from typing import Any

from attnseq.data.batch import NO_ALIGNMENT, Batch, collate
from attnseq.data.errors import DataError
from attnseq.data.example import EncodedExample, Example, encode_examples
from attnseq.data.lengths import filter_by_source_length, validate_length_range
from attnseq.data.sampler import EpochPermutationSampler, LengthBucketBatchSampler, padding_fraction
from attnseq.data.splits import split_examples
from attnseq.data.tasks import DICTIONARY, TASKS, generate, make_task, symbol_tokens
from attnseq.data.tokenizers import SPACE_TOKEN, TOKENIZERS, tokenize
from attnseq.data.tsv import read_tsv
from attnseq.data.vocab import BOS, EOS, PAD, SPECIAL_TOKENS, UNK, Vocabulary

__all__ = [
    "BOS", "DATA_TASKS", "DICTIONARY", "EOS", "NO_ALIGNMENT", "PAD", "SPACE_TOKEN", "SPECIAL_TOKENS",
    "TASKS", "TOKENIZERS", "UNK", "Batch", "DataError", "EncodedExample", "EpochPermutationSampler",
    "Example", "LengthBucketBatchSampler", "Seq2SeqDataModule", "Vocabulary", "collate",
    "encode_examples", "filter_by_source_length", "generate", "make_task", "padding_fraction",
    "read_tsv", "split_examples", "symbol_tokens", "tokenize", "validate_length_range",
]

_LIGHTNING_NAMES = {"DATA_TASKS", "Seq2SeqDataModule"}


def __getattr__(name: str) -> Any:
    if name in _LIGHTNING_NAMES:
        from attnseq.data import datamodule

        return getattr(datamodule, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
