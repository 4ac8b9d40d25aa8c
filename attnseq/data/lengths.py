"""Source-length ranges: checking a ``[lo, hi]`` pair and filtering examples by it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated

from pydantic import AfterValidator, StrictInt, TypeAdapter, ValidationError

from attnseq.data.example import Example
from attnseq.problems import PAIR, _pair, shown


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_length_range(lengths: object, name: str = "lengths") -> tuple[int, int]:
    """Return ``lengths`` (any two-item sequence of ints: tuple, list, Hydra ListConfig) as ``(lo, hi)``
    after the config's own check of a length range (``LengthRange``'s: 1 <= lo <= hi)."""
    try:
        return TypeAdapter(Annotated[tuple[StrictInt, StrictInt], AfterValidator(_pair)]).validate_python(lengths)
    except ValidationError as error:
        example = (error.errors()[0].get("ctx") or {}).get("example") or [1, 10]
        raise ValueError(f"{name}={lengths!r} must be {PAIR}; write e.g. {name}={shown(example)}") from None


def filter_by_source_length(examples: Iterable[Example], lengths: Sequence[int]) -> list[Example]:
    """The examples whose source length lies in the inclusive range ``lengths``, order kept."""
    lo, hi = validate_length_range(lengths)
    return [ex for ex in examples if lo <= len(ex.src) <= hi]
