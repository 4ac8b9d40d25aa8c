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
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

from attnseq.data.example import Example
from attnseq.data.lengths import is_int, validate_length_range

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


@dataclass(frozen=True)
class SymbolTask:
    """Base of copy/reverse/sort: the target is the source read in ``target_order``."""

    num_symbols: int = 10

    def __post_init__(self) -> None:
        if not is_int(self.num_symbols) or self.num_symbols < 1:
            raise ValueError(f"num_symbols must be an int >= 1, got {self.num_symbols!r}; the default is 10")

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


@dataclass(frozen=True)
class CopyTask(SymbolTask):
    def target_order(self, symbols: list[int]) -> list[int]:
        return list(range(len(symbols)))


@dataclass(frozen=True)
class ReverseTask(SymbolTask):
    def target_order(self, symbols: list[int]) -> list[int]:
        return list(range(len(symbols) - 1, -1, -1))


@dataclass(frozen=True)
class SortTask(SymbolTask):
    def target_order(self, symbols: list[int]) -> list[int]:
        return sorted(range(len(symbols)), key=lambda i: symbols[i])  # sorted() is stable


@dataclass(frozen=True)
class TranslateTask:
    """Toy translation with adjective-noun swaps; see the module docstring for the grammar."""

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


Task = CopyTask | ReverseTask | SortTask | TranslateTask

TASKS: dict[str, type] = {"copy": CopyTask, "reverse": ReverseTask, "sort": SortTask, "translate": TranslateTask}


def make_task(name: str, **options: object) -> Task:
    """The task called ``name``, configured with ``options`` (``num_symbols`` for symbol tasks)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}")
    cls = TASKS[name]
    valid = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"task {name!r} has no option(s) {unknown}; its options are: {', '.join(valid) if valid else 'none'}"
        )
    return cls(**options)


def generate(task: str, n: int, lengths: Sequence[int], seed: int, **task_options: object) -> list[Example]:
    """``n`` examples of ``task``, source lengths uniform in the inclusive range ``lengths``.

    Uses only a local ``random.Random(seed)``: the same arguments always give the same list.
    """
    spec = make_task(task, **task_options)
    lo, hi = validate_length_range(lengths)
    if not is_int(n) or n < 0:
        raise ValueError(f"n (the number of examples) must be an int >= 0, got {n!r}")
    if not is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")
    rng = random.Random(seed)
    return [spec.example(rng, rng.randint(lo, hi)) for _ in range(n)]
