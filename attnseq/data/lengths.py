"""Source-length ranges: checking a ``[lo, hi]`` pair and filtering examples by it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from attnseq.data.example import Example


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_length_range(lengths: object, name: str = "lengths") -> tuple[int, int]:
    """Return ``lengths`` as ``(lo, hi)`` after checking it is an inclusive range with 1 <= lo <= hi.

    Accepts any two-item sequence (tuple, list, Hydra ListConfig) of ints.
    """
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) or len(lengths) != 2:
        raise ValueError(f"{name} must be a [lo, hi] pair of ints, got {lengths!r}; write e.g. {name}=[1, 10]")
    lo, hi = lengths[0], lengths[1]
    if not (is_int(lo) and is_int(hi)):
        raise ValueError(
            f"{name}={lengths!r} must hold ints (got {type(lo).__name__}, {type(hi).__name__}); "
            f"write whole numbers, e.g. {name}=[1, 10]"
        )
    if lo < 1:
        raise ValueError(
            f"{name}={lengths!r} starts below 1, but a sequence needs at least one token; "
            f"use 1 <= lo <= hi, e.g. {name}=[1, {max(hi, 1)}]"
        )
    if lo > hi:
        raise ValueError(f"{name}={lengths!r} has lo > hi; swap them: {name}=[{hi}, {lo}]")
    return lo, hi


def filter_by_source_length(examples: Iterable[Example], lengths: Sequence[int]) -> list[Example]:
    """The examples whose source length lies in the inclusive range ``lengths``, order kept."""
    lo, hi = validate_length_range(lengths)
    return [ex for ex in examples if lo <= len(ex.src) <= hi]
