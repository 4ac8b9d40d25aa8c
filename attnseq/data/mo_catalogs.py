"""Reading compiled gettext catalogs (``.mo`` files): the English messages and their translations.

The format (GNU gettext manual, "The Format of GNU MO Files") is a 28-byte header — magic number,
revision, number of strings N, offset of the table of original strings, offset of the table of
translations, hash table size and offset — then two tables of N (length, offset) pairs pointing at
the strings. The magic number's byte order gives the file's. Within an original string, a context
is written ``msgctxt EOT msgid`` and a plural entry ``msgid NUL msgid_plural``; the translation of
a plural entry is its forms separated by NUL. The entry with the empty msgid is the header, which
names the character set of the strings.

This reader keeps one pair per entry: the context is stripped, a plural entry gives its singular
pair (``msgid``, first form), the header and entries without a translation are skipped; each of
these is counted, so the corpus builder can say what it read.
"""

from __future__ import annotations

import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = 0x950412DE
"""The first four bytes of a ``.mo`` file, read in the file's own byte order."""
CONTEXT_SEPARATOR = b"\x04"
PLURAL_SEPARATOR = b"\x00"
_CHARSET = re.compile(rb"charset=([\w.:-]+)", re.IGNORECASE)


class CatalogFormatError(ValueError):
    """A file that is not a readable ``.mo`` catalog (wrong magic number, truncated tables, unknown charset)."""


@dataclass(frozen=True)
class MessagePair:
    """An English message and its translation, as the catalog holds them (before any cleaning)."""

    source: str
    target: str
    catalog: str


@dataclass
class Catalog:
    """The pairs one ``.mo`` file gives, and how many of its entries each reading rule touched.

    ``counts`` keys: ``entries`` (all, header included), ``header``, ``context_stripped``,
    ``plural_singular_kept``, ``untranslated`` (empty translation), ``undecodable`` (bytes that are
    not text in the catalog's charset), ``pairs`` (what ``pairs`` holds).
    """

    name: str
    pairs: list[MessagePair] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)


def _byte_order(data: bytes, path: Path) -> str:
    if len(data) < 28:
        raise CatalogFormatError(f"{path}: {len(data)} bytes, shorter than the 28-byte .mo header")
    for order in ("<", ">"):
        if struct.unpack_from(f"{order}I", data)[0] == MAGIC:
            return order
    raise CatalogFormatError(f"{path}: not a .mo file (magic number {data[:4].hex()})")


def _charset(header: bytes) -> str:
    found = _CHARSET.search(header)
    return found.group(1).decode("ascii") if found else "utf-8"


def read_catalog(path: str | Path) -> Catalog:
    """Every (English, translation) pair of the ``.mo`` file at ``path``, with the reading counts.

    Raises:
        CatalogFormatError: the file is not a ``.mo`` catalog, is truncated, or names a charset
            Python does not know.
    """
    path = Path(path)
    data = path.read_bytes()
    order = _byte_order(data, path)
    revision, count, originals_at, translations_at = struct.unpack_from(f"{order}4I", data, 4)
    if revision >> 16 > 1:
        raise CatalogFormatError(f"{path}: .mo major revision {revision >> 16}, this reader knows 0 and 1")
    raw = []
    try:
        for index in range(count):
            length, offset = struct.unpack_from(f"{order}2I", data, originals_at + 8 * index)
            original = data[offset : offset + length]
            length, offset = struct.unpack_from(f"{order}2I", data, translations_at + 8 * index)
            translation = data[offset : offset + length]
            raw.append((original, translation))
    except struct.error as error:
        raise CatalogFormatError(f"{path}: truncated string table ({error})") from None
    header = next((translation for original, translation in raw if original == b""), b"")
    charset = _charset(header)
    try:
        "".encode(charset)
    except LookupError:
        raise CatalogFormatError(f"{path}: unknown charset {charset!r} in its header") from None

    catalog = Catalog(name=path.stem)
    counts = catalog.counts
    for original, translation in raw:
        counts["entries"] += 1
        if original == b"":
            counts["header"] += 1
            continue
        if CONTEXT_SEPARATOR in original:
            original = original.split(CONTEXT_SEPARATOR, 1)[1]
            counts["context_stripped"] += 1
        if PLURAL_SEPARATOR in original:
            original = original.split(PLURAL_SEPARATOR, 1)[0]
            translation = translation.split(PLURAL_SEPARATOR, 1)[0]
            counts["plural_singular_kept"] += 1
        if translation == b"":
            counts["untranslated"] += 1
            continue
        try:
            source, target = original.decode(charset), translation.decode(charset)
        except UnicodeDecodeError:
            counts["undecodable"] += 1
            continue
        catalog.pairs.append(MessagePair(source=source, target=target, catalog=catalog.name))
    counts["pairs"] = len(catalog.pairs)
    return catalog
