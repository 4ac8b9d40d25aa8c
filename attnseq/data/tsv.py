"""Reading a tab-separated parallel corpus (``source<TAB>target`` per line): its text pairs
(``read_pairs``), or Examples tokenised by a rule (``read_tsv``).

The format is the Tatoeba / manythings.org Anki sentence-pair file, restricted to exactly two
columns: every line must hold exactly one tab. Anki downloads carry a third attribution column;
``read_tsv`` rejects it with the fix (``cut -f1,2``) rather than guessing which columns to keep.
Lines end with ``\\n`` or ``\\r\\n``; a UTF-8 byte-order mark is ignored; lines ending in ``\\r``
alone (old Mac files) are an error that says so. Blank lines are errors too (a blank line is a
line without a tab), which keeps line numbers meaningful.

A corpus split beforehand is a folder holding ``train.tsv``, ``val.tsv`` and ``test.tsv``
(``SPLIT_FILES``, read by ``read_split_folder``).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

from attnseq.data.errors import DataError
from attnseq.data.example import Example
from attnseq.data.tokenizers import RULE_TOKENIZERS, check_tokenizer, tokenize

SPLIT_FILES = {"train": "train.tsv", "val": "val.tsv", "test": "test.tsv"}
"""The files of a corpus folder, by split."""

_UTF8_BOM = b"\xef\xbb\xbf"
_LONE_CR = re.compile(r"\r(?!\n)")
_CR_FIX = "tr '\\r' '\\n' < in.tsv > out.tsv"


def _read_text(path: Path, folder: int | None = None) -> str:
    """The text of ``path``; with ``folder`` (a descriptor of the folder ``path`` is in), the file of
    that name in the very folder the descriptor holds, even if another folder took its path since."""
    if folder is not None:
        return _read_in_folder(path, folder)
    if not path.exists():
        raise DataError(
            path,
            "file not found",
            f"check the path; a relative path is resolved from the working directory {os.getcwd()} "
            "(Hydra may change it), so prefer an absolute path",
        )
    if path.is_dir():
        raise DataError(path, "is a directory, not a file", "point to the tab-separated file inside it")
    if not path.is_file():
        raise DataError(path, "not a regular file", "point to a tab-separated text file")
    return _decode(path, path.read_bytes())


def _read_in_folder(path: Path, folder: int) -> str:
    try:
        info = os.stat(path.name, dir_fd=folder)
    except FileNotFoundError:
        raise DataError(
            path, "vanished while the corpus folder was read: the folder was replaced meanwhile (a corpus "
            "rebuild finished)", "run again: the rebuilt corpus is read whole",
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise DataError(path, "not a regular file", "point to a tab-separated text file")
    with open(path.name, "rb", opener=lambda name, flags: os.open(name, flags, dir_fd=folder)) as file:
        return _decode(path, file.read())


def _decode(path: Path, data: bytes) -> str:
    if data.startswith(_UTF8_BOM):
        data = data[len(_UTF8_BOM) :]
    if data.strip() == b"":
        raise DataError(path, "file is empty", "fill it with one 'source<TAB>target' pair per line")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise DataError(
            path,
            f"not valid UTF-8: byte 0x{data[error.start]:02x} at byte {column} of the line",
            "re-save the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 in.tsv > out.tsv`",
            line=line,
        ) from None


def _reject_old_mac_line_endings(path: Path, text: str) -> None:
    """Lines that end with a carriage return alone (old Mac files): the file reads as one line."""
    if _LONE_CR.search(text) is None or "\n" in text.rstrip("\n"):
        return
    raise DataError(
        path,
        "lines end with a carriage return (\\r) alone, the old Mac line ending, so the whole file reads as one line",
        f"convert the line endings to \\n, e.g. `{_CR_FIX}`",
    )


class TextPair(NamedTuple):
    source: str
    target: str


def read_tsv(path: str | Path, tokenizer: str = "word", lowercase: bool = True) -> list[Example]:
    """All sentence pairs of ``path``, tokenised by a rule, in file order, with ``alignment=None``.

    Raises:
        DataError: as ``read_pairs``.
        ValueError: ``tokenizer`` is not ``word`` or ``char`` (subwords are learned: the data module
            trains them on the training split).
    """
    check_tokenizer(tokenizer)
    if tokenizer not in RULE_TOKENIZERS:
        raise ValueError(f"read_tsv tokenises by a rule ({', '.join(RULE_TOKENIZERS)}); {tokenizer!r} is learned "
                         "from the training split: use Seq2SeqData, or read_pairs and SubwordTokenizer")
    return [
        Example(tokenize(pair.source, tokenizer, lowercase), tokenize(pair.target, tokenizer, lowercase), None)
        for pair in read_pairs(path)
    ]


def split_files(folder: str | Path) -> dict[str, Path]:
    """Each split's file in a corpus folder (``SPLIT_FILES``).

    Raises:
        DataError: one is missing; the message names it.
    """
    folder = Path(folder)
    missing = [name for name in SPLIT_FILES.values() if not (folder / name).is_file()]
    if missing:
        raise DataError(
            folder / missing[0],
            f"a corpus folder holds {', '.join(SPLIT_FILES.values())}, and this one lacks {', '.join(missing)}",
            "write the missing split files (the corpus builder writes all three), or point dataset.path "
            "to a single tab-separated file to have it split",
        )
    return {split: folder / name for split, name in SPLIT_FILES.items()}


def read_split_folder(folder: str | Path) -> dict[str, list[TextPair]]:
    """The pairs of each split of a corpus folder (``SPLIT_FILES``), all three from one folder: the
    folder is opened once, so a rebuild that renames a new folder into its place meanwhile
    (``python build_corpus.py``) cannot mix splits of two builds.

    Raises:
        DataError: as ``split_files`` and ``read_pairs``.
    """
    files = split_files(folder)
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return {split: read_pairs(path, folder=descriptor) for split, path in files.items()}
    finally:
        os.close(descriptor)


def read_pairs(path: str | Path, folder: int | None = None) -> list[TextPair]:
    """All (source, target) text pairs of ``path``, in file order, as written (with ``folder``, a
    descriptor of its folder: the file of that name in that very folder).

    Raises:
        DataError: the file is missing, empty or not UTF-8; a line has not exactly one tab; or
            one side of a pair is blank. The message names the path, the line and the fix.
    """
    path = Path(path)
    text = _read_text(path, folder)
    _reject_old_mac_line_endings(path, text)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line does not start a new one
    pairs = []
    for number, line in enumerate(lines, start=1):
        line = line.removesuffix("\r")
        tabs = line.count("\t")
        if line.strip() == "":
            raise DataError(path, "blank line", "delete it: every line must be 'source<TAB>target'", line=number)
        if tabs == 0:
            raise DataError(
                path,
                "no tab on this line",
                "separate source and target with one tab character (not spaces): 'source<TAB>target'",
                line=number,
            )
        if tabs > 1 and _LONE_CR.search(line):
            raise DataError(
                path,
                f"{tabs} tabs on this line, which holds carriage returns (\\r) not followed by a newline: "
                "lines ending in \\r alone (the old Mac line ending) run together",
                f"convert those line endings to \\n, e.g. `{_CR_FIX}`",
                line=number,
            )
        if tabs > 1:
            raise DataError(
                path,
                f"{tabs} tabs on this line, expected exactly one (source<TAB>target)",
                "keep only the first two columns, e.g. `cut -f1,2 in.tsv > out.tsv` for Anki files "
                "with an attribution column, and remove tabs inside sentences",
                line=number,
            )
        source, target = line.split("\t")
        for side, text in (("source", source), ("target", target)):
            if text.strip() == "":
                raise DataError(
                    path, f"empty {side} side", "give both sides some text, or delete the line", line=number
                )
        pairs.append(TextPair(source, target))
    return pairs
