"""Synthetic seq2seq tasks with gold alignments, generated deterministically from a seed.

Symbol tasks (``copy``, ``reverse``, ``sort``) draw tokens uniformly from an alphabet of
``num_symbols`` symbols named ``s0, s1, ..., s{num_symbols-1}``; ``sort`` orders them by
their number (s2 before s10), stably, so equal symbols keep their source order.

``translate`` is a toy English -> French-like translation. A source sentence is the clause chain

    NP VERB NP and NP VERB NP and ...      NP = NOUN | DET NOUN | ADJ NOUN | DET ADJ NOUN

cut at exactly the drawn length L: every noun phrase is sized (1-3 tokens) to fit the tokens
left, so no phrase is ever cut in half, and the object phrase is sized so a sentence never ends
on a dangling "and" (it may end after a verb, read as intransitive: "the cat sees"). Hence
every length L >= 1 is reachable. Each word is translated through the fixed ``DICTIONARY``
and every ADJ NOUN pair is swapped ("black cat" -> "chat noir"), so the gold alignment is a
permutation of source positions that is not monotonic whenever an adjective occurs.

Every task (the TSV corpus too) is a ``Task``: a settings model registered by its ``task`` name with
its capabilities (``has_gold_alignment``, ``is_text``, ``is_symbolic``, ``generated``), so adding one is one class
and one ``conf/dataset/<name>.yaml``; ``dataset_model`` adds the keys every dataset has.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, create_model

from attnseq.data.example import Example
from attnseq.data.lengths import is_int, validate_length_range
from attnseq.data.tokenizers import (
    RULE_TOKENIZERS,
    SYMBOLS,
    TOKENIZERS,
    RuleTokenizer,
    SubwordTokenizer,
    TextTokenizer,
    check_tokenizer,
)
from attnseq.problems import LengthRange, validated
from attnseq.registry import Choice, Registry

DETERMINERS = {"the": "le", "a": "un", "my": "mon", "this": "ce"}
ADJECTIVES = {
    "black": "noir", "white": "blanc", "red": "rouge", "green": "vert",
    "blue": "bleu", "sad": "triste", "fast": "rapide", "calm": "calme",
}
NOUNS = {
    "cat": "chat", "dog": "chien", "bird": "oiseau", "horse": "cheval",
    "fish": "poisson", "mouse": "souris", "wolf": "loup", "bear": "ours",
}
VERBS = {"sees": "voit", "likes": "aime", "eats": "mange", "follows": "suit", "chases": "chasse", "finds": "trouve"}
CONJUNCTIONS = {"and": "et"}
DICTIONARY: dict[str, str] = {**DETERMINERS, **ADJECTIVES, **NOUNS, **VERBS, **CONJUNCTIONS}
_DETERMINERS, _ADJECTIVES, _NOUNS, _VERBS = tuple(DETERMINERS), tuple(ADJECTIVES), tuple(NOUNS), tuple(VERBS)


def symbol_tokens(num_symbols: int) -> list[str]:
    """The alphabet of the symbol tasks: ``["s0", ..., f"s{num_symbols - 1}"]``."""
    return [f"s{i}" for i in range(num_symbols)]


MAX_VOCABULARY = 1_000_000
"""The most tokens per side: the embedding and output layers hold a row per token (and the memory check counts them)."""
TASKS = Registry("task", "dataset.task")
"""Every registered task by its ``task`` name."""
TEXT_TASKS = TASKS.having(is_text=True)
"""The tasks whose outputs are sentences (sacreBLEU, chrF); a live view, so plugins' tasks are in it too."""


class Task(Choice):
    """A task's own settings (``dataset.*`` besides the shared ones) and how it makes examples."""

    registry: ClassVar[Registry] = TASKS
    task: str
    has_gold_alignment: ClassVar[bool] = True
    """Its examples carry the source position each target token copies (alignment metrics)."""
    is_text: ClassVar[bool] = False
    """Its outputs are read as text (a symbol task's: its tokens joined by spaces): sacreBLEU, chrF and TER
    are reported."""
    generated: ClassVar[bool] = True
    """Its examples are generated from a seed (``example``); False: read from a corpus (``dataset.path``)."""
    shares_vocabulary: ClassVar[bool] = False
    """Its source and target are one token set, one ``Vocabulary``: ``model.share_embeddings`` can work."""
    is_symbolic: ClassVar[bool] = False
    """Its tokens are symbols, not words: a text score of its outputs (``reverse``'s sacreBLEU) moves with their
    exact match and token accuracy, so a comparison tests those alone (no text bootstrap)."""

    def source_tokens(self) -> list[str]:
        raise NotImplementedError

    def target_tokens(self) -> list[str]:
        raise NotImplementedError

    def example(self, rng: random.Random, length: int) -> Example:
        raise NotImplementedError


class SymbolTask(Task):
    """Base of copy/reverse/sort: the target is the source read in ``target_order``."""

    shares_vocabulary: ClassVar[bool] = True
    is_symbolic: ClassVar[bool] = True

    num_symbols: int = Field(10, ge=1, le=MAX_VOCABULARY, description="the alphabet's size: symbols s0 … "
                             "s{num_symbols-1}")

    def source_tokens(self) -> list[str]:
        return symbol_tokens(self.num_symbols)

    def target_tokens(self) -> list[str]:
        return symbol_tokens(self.num_symbols)

    def target_order(self, symbols: list[int]) -> list[int]:
        """The source positions, in the order the target reads them (this is the gold alignment)."""
        raise NotImplementedError

    def example(self, rng: random.Random, length: int) -> Example:
        symbols = [rng.randrange(self.num_symbols) for _ in range(length)]
        src = [f"s{k}" for k in symbols]
        order = self.target_order(symbols)
        return Example(src=src, tgt=[src[i] for i in order], alignment=order)


class CopyTask(SymbolTask):
    task: Literal["copy"] = "copy"

    def target_order(self, symbols: list[int]) -> list[int]:
        return list(range(len(symbols)))


class ReverseTask(SymbolTask):
    task: Literal["reverse"] = "reverse"
    is_text: ClassVar[bool] = True  # scored with sacreBLEU as JoeyNMT's reverse tutorial is (experiment=joey_reverse)

    def target_order(self, symbols: list[int]) -> list[int]:
        return list(range(len(symbols) - 1, -1, -1))


class SortTask(SymbolTask):
    task: Literal["sort"] = "sort"

    def target_order(self, symbols: list[int]) -> list[int]:
        return sorted(range(len(symbols)), key=lambda i: symbols[i])  # sorted() is stable


class TranslateTask(Task):
    """Toy translation with adjective-noun swaps; see the module docstring for the grammar."""

    task: Literal["translate"] = "translate"
    is_text: ClassVar[bool] = True

    def source_tokens(self) -> list[str]:
        return list(DICTIONARY)

    def target_tokens(self) -> list[str]:
        return list(dict.fromkeys(DICTIONARY.values()))

    def _noun_phrase(self, rng: random.Random, size: int) -> list[str]:
        noun = rng.choice(_NOUNS)
        if size == 1:
            return [noun]
        if size == 2:
            return [rng.choice(_DETERMINERS + _ADJECTIVES), noun]
        return [rng.choice(_DETERMINERS), rng.choice(_ADJECTIVES), noun]

    def source_sentence(self, rng: random.Random, length: int) -> list[str]:
        words: list[str] = []
        slots = ("subject", "verb", "object", "and")
        slot = 0
        while len(words) < length:
            left = length - len(words)
            kind = slots[slot % len(slots)]
            if kind in ("subject", "object"):
                sizes = [k for k in (1, 2, 3) if k <= left]
                if kind == "object" and len(sizes) > 1:
                    sizes = [k for k in sizes if left - k != 1]  # never leave room for only "and"
                words += self._noun_phrase(rng, rng.choice(sizes))
            elif kind == "verb":
                words.append(rng.choice(_VERBS))
            else:
                words.append("and")
            slot += 1
        return words

    def example(self, rng: random.Random, length: int) -> Example:
        src = self.source_sentence(rng, length)
        order: list[int] = []
        i = 0
        while i < len(src):
            if src[i] in ADJECTIVES and i + 1 < len(src) and src[i + 1] in NOUNS:
                order += [i + 1, i]  # "black cat" -> "chat noir"
                i += 2
            else:
                order.append(i)
                i += 1
        return Example(src=src, tgt=[DICTIONARY[src[i]] for i in order], alignment=order)


class TsvTask(Task):
    """A parallel corpus, one "source<TAB>target" pair per line, or a folder of train/val/test.tsv."""

    task: Literal["tsv"] = "tsv"
    has_gold_alignment: ClassVar[bool] = False
    is_text: ClassVar[bool] = True
    generated: ClassVar[bool] = False
    path: str = Field(min_length=1, description="a file, or a folder of train.tsv, val.tsv, test.tsv (absolute)",
                      examples=["/abs/path/pairs.tsv"])
    tokenizer: Literal[TOKENIZERS] = Field("word", description="word | char | bpe | unigram")
    vocab_size: int = Field(2000, ge=1, le=MAX_VOCABULARY, description="subword pieces per side (bpe, unigram)")
    lowercase: bool = True


class DatasetKeys(BaseModel):
    """The keys every ``conf/dataset/<task>.yaml`` has besides its task's own."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    train_lengths: LengthRange = Field(description="inclusive [lo, hi] source lengths of the training set",
                                       examples=[[1, 15]])
    eval_lengths: LengthRange = Field(description="[lo, hi] of validation and test (may reach past training)",
                                      examples=[[1, 30]])
    bucket_width: PositiveInt = Field(description="width of the length buckets the metrics report", examples=[5])
    train_size: PositiveInt = Field(description="training examples (tsv: a proportion and a cap)", examples=[12800])
    val_size: PositiveInt = Field(description="validation examples", examples=[1000])
    test_size: PositiveInt = Field(description="test examples", examples=[1000])
    batch_size: PositiveInt = Field(description="examples per batch; with batch_type=token, the most padded positions "
                                    "per batch", examples=[64])
    batch_type: Literal["sentence", "token"] = Field("sentence", description="what batch_size counts (JoeyNMT's "
                                                     "batch_type): sentence = examples; token = each batch's padded "
                                                     "size, examples × the longest one's max(source, target + 1) "
                                                     "(fairseq's --max-tokens)")
    length_bucketing: bool = Field(True, description="batch training examples of similar length")
    bucket_pool: int = Field(50, ge=1, le=100_000, description="with length_bucketing: batches' worth of shuffled "
                             "examples sorted by length together (1: random batches; more: less padding)")
    num_workers: int = Field(0, ge=0, le=64, description="DataLoader worker processes (each a process with torch "
                             "and a copy of the data)")


@functools.cache
def dataset_model(task: type[Task]) -> type[BaseModel]:
    """``dataset.*`` for ``task``: its own settings and the shared keys, in one flat model."""
    return create_model(f"{task.__name__}Dataset", __base__=(task, DatasetKeys), __module__=task.__module__)


def make_task(name: str, **options: object) -> Task:
    """The task called ``name``, configured with ``options`` (``num_symbols`` for symbol tasks)."""
    return validated(TASKS.lookup(name), {"task": name, **options}, prefix="dataset")


def generate(task: str | Task, n: int, lengths: Sequence[int], seed: int, **task_options: object) -> list[Example]:
    """``n`` examples of ``task`` (a name and its options, or a ``Task``), source lengths uniform in
    the inclusive range ``lengths``.

    Uses only a local ``random.Random(seed)``: the same arguments always give the same list.
    """
    spec = task if isinstance(task, Task) else make_task(task, **task_options)
    lo, hi = validate_length_range(lengths)
    if not is_int(n) or n < 0:
        raise ValueError(f"n (the number of examples) must be an int >= 0, got {n!r}")
    if not is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")
    rng = random.Random(seed)
    return [spec.example(rng, rng.randint(lo, hi)) for _ in range(n)]


def tokenizer_for(dataset: Mapping[str, Any], saved_json: str | None = None) -> TextTokenizer:
    """One side's tokenizer as a run's ``dataset`` config describes it: ``SYMBOLS`` for the synthetic
    tasks, ``word``/``char`` by rule, ``bpe``/``unigram`` from the JSON the run saved."""
    if TASKS.lookup(dataset.get("task")).generated:
        return RuleTokenizer(SYMBOLS)
    kind = check_tokenizer(dataset.get("tokenizer", "word"))
    if kind in RULE_TOKENIZERS:
        return RuleTokenizer(kind, bool(dataset.get("lowercase", True)))
    if saved_json is None:
        raise ValueError(f"a {kind} run's tokenizer is learned: pass the JSON the run saved")
    return SubwordTokenizer.from_json(saved_json)
