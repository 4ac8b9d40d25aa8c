"""One sentence pair, as tokens (``Example``) and as ids (``EncodedExample``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from attnseq.data.vocab import Vocabulary


def _check_alignment(alignment: list[int] | None, src_len: int, tgt_len: int) -> None:
    if alignment is None:
        return
    if len(alignment) != tgt_len:
        raise ValueError(
            f"alignment has {len(alignment)} entries but the target has {tgt_len} tokens; give one per target token"
        )
    for j, i in enumerate(alignment):
        if not -1 <= i < src_len:
            raise ValueError(
                f"alignment[{j}] = {i} is not a source position: use 0..{src_len - 1}, or -1 for an unaligned token"
            )


@dataclass(frozen=True)
class Example:
    """A source/target token pair.

    ``alignment[j]`` is the 0-based source position that target token ``j`` comes from, ``-1`` if
    none; ``alignment`` is None when the data has no gold alignment (e.g. a TSV corpus).
    """

    src: list[str]
    tgt: list[str]
    alignment: list[int] | None = None

    def __post_init__(self) -> None:
        if len(self.src) == 0:
            raise ValueError("an example needs at least one source token")
        _check_alignment(self.alignment, len(self.src), len(self.tgt))


@dataclass(frozen=True)
class EncodedExample:
    """An ``Example`` mapped to ids; BOS/EOS are not added here but by ``collate``."""

    src: list[int]
    tgt: list[int]
    alignment: list[int] | None = None

    def __post_init__(self) -> None:
        if len(self.src) == 0:
            raise ValueError("an encoded example needs at least one source id")
        _check_alignment(self.alignment, len(self.src), len(self.tgt))


def encode_examples(
    examples: Iterable[Example], src_vocab: Vocabulary, tgt_vocab: Vocabulary
) -> list[EncodedExample]:
    """Map each example's tokens to ids (unknown tokens become UNK), keeping its alignment."""
    return [
        EncodedExample(
            src_vocab.encode(ex.src), tgt_vocab.encode(ex.tgt), None if ex.alignment is None else list(ex.alignment)
        )
        for ex in examples
    ]
