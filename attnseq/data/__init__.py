"""Data for attnseq: synthetic tasks with gold alignments, TSV corpora, vocabularies, batching."""

from attnseq.data.batch import NO_ALIGNMENT, Batch, collate
from attnseq.data.datamodule import DATA_TASKS, Seq2SeqDataModule
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
