"""The errors attnseq raises on purpose: each names the bad value, what it must be, and the fix."""

from __future__ import annotations

from collections.abc import Sequence


class AttnSeqError(ValueError):
    """Base of every error attnseq raises on purpose, with a message meant for the user.

    The command-line entry points print such an error as one message, without a traceback
    (``HYDRA_FULL_ERROR=1`` shows it), and exit with ``exit_code``.
    """

    exit_code = 2  # a usage error: the command, its config or its input must change

    def __reduce__(self) -> tuple:
        # a sweep's launcher (joblib, submitit) sends a failed job's error back pickled: it is rebuilt
        # from its message and attributes, whatever its class's __init__ takes
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type[AttnSeqError], args: tuple, state: dict) -> AttnSeqError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ProblemAndFix(AttnSeqError):
    """An error told as what is wrong, then what to do about it."""

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}\n  Fix: {fix}")


class ConfigError(ProblemAndFix):
    """A configuration that cannot work, caught before any tensor is built."""


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


class TrainingError(ProblemAndFix):
    """Training cannot go on (e.g. the loss became NaN); the run is marked FAILED."""

    exit_code = 1
