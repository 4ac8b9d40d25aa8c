"""The errors attnseq raises on purpose: each names the bad value, what it must be, and the fix."""

from __future__ import annotations

from collections.abc import Sequence


class AttnSeqError(ValueError):
    """Base of every error attnseq raises for bad input or configuration."""


class ConfigError(AttnSeqError):
    """A configuration that cannot work, caught before any tensor is built."""

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}\n  Fix: {fix}")


class ShapeError(AttnSeqError):
    """A tensor whose shape does not match what the computation needs.

    Raised instead of letting a wrong shape broadcast silently into lower accuracy later.
    """

    def __init__(self, tensor: str, shape: Sequence[int], expected: str, fix: str) -> None:
        self.tensor = tensor
        self.shape = tuple(shape)
        self.expected = expected
        self.fix = fix
        super().__init__(
            f"{tensor} has shape {self.shape}, but it must be {expected}.\n  Fix: {fix}"
        )
