"""A tiny writer of gettext ``.mo`` catalogs, for tests that need catalogs with known entries.

Entries are ``(msgid, msgstr)``; a context is written ``"ctxt\\x04msgid"``, a plural entry
``("one\\x00many", "un\\x00plusieurs")``, as in the format itself. The header entry (empty msgid)
is added with the charset given.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

MAGIC = 0x950412DE


def mo_bytes(entries: Iterable[tuple[str, str]], charset: str = "UTF-8", byte_order: str = "<") -> bytes:
    header = f"Content-Type: text/plain; charset={charset}\nLanguage: xx\n"
    encoded = [(b"", header.encode("ascii"))]
    encoded += [(msgid.encode(charset), msgstr.encode(charset)) for msgid, msgstr in entries]
    encoded.sort(key=lambda entry: entry[0])  # the format keeps originals sorted (for binary search)
    count = len(encoded)
    originals_at = 28
    translations_at = originals_at + 8 * count
    strings_at = translations_at + 8 * count
    table_originals, table_translations, strings = [], [], b""
    for table, index in ((table_originals, 0), (table_translations, 1)):
        for entry in encoded:
            table.append((len(entry[index]), strings_at + len(strings)))
            strings += entry[index] + b"\x00"
    head = struct.pack(f"{byte_order}7I", MAGIC, 0, count, originals_at, translations_at, 0, strings_at)
    tables = b"".join(struct.pack(f"{byte_order}2I", *row) for row in table_originals + table_translations)
    return head + tables + strings


def write_mo(path: Path, entries: Iterable[tuple[str, str]], charset: str = "UTF-8", byte_order: str = "<") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(mo_bytes(entries, charset=charset, byte_order=byte_order))
    return path
