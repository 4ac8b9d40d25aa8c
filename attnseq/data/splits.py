"""Deterministic train/validation/test splits of a list of examples (or of text pairs)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TypeVar

Item = TypeVar("Item")


def split_examples(
    examples: Sequence[Item], fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0
) -> tuple[list[Item], list[Item], list[Item]]:
    """Shuffle with ``random.Random(seed)`` and cut into (train, val, test).

    ``fractions`` = (train, val, test), non-negative and summing to 1. Validation and test get
    ``floor(fraction * n)`` examples each and train the rest, so no example is lost or repeated.
    """
    if len(fractions) != 3 or any(not isinstance(f, (int, float)) or f < 0 for f in fractions):
        raise ValueError(f"fractions must be three non-negative numbers (train, val, test), got {fractions!r}")
    if not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
        raise ValueError(
            f"fractions {tuple(fractions)!r} sum to {sum(fractions):g}; make them sum to 1, e.g. (0.8, 0.1, 0.1)"
        )
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_val = math.floor(fractions[1] * len(order) + 1e-9)
    n_test = math.floor(fractions[2] * len(order) + 1e-9)
    val = [examples[i] for i in order[:n_val]]
    test = [examples[i] for i in order[n_val : n_val + n_test]]
    train = [examples[i] for i in order[n_val + n_test :]]
    return train, val, test
