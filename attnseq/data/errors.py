"""The error raised for a bad data file: it names the file, the line and the fix."""

from __future__ import annotations

from pathlib import Path

from attnseq.errors import AttnSeqError


class DataError(AttnSeqError):
    """A data file that cannot be used as it is.

    The message reads ``PATH:LINE: PROBLEM. Fix: FIX`` (``PATH: ...`` when the problem is not on
    one line, e.g. a missing file), so editors and terminals can jump to the spot.

    Attributes:
        path: the file, as given.
        line: 1-based line number, or None when the problem concerns the whole file.
        problem: what is wrong.
        fix: what the user should do about it.
    """

    def __init__(self, path: str | Path, problem: str, fix: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        self.problem = problem
        self.fix = fix
        location = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{location}: {problem}. Fix: {fix}")

    def __reduce__(self):  # keep the error picklable across DataLoader worker processes
        return (type(self), (self.path, self.problem, self.fix, self.line))
