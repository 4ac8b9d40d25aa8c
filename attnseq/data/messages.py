"""The messages corpus: English → another language, from the gettext catalogs installed on this machine.

    python build_corpus.py --lang fr          # → data/messages_en-fr/{train,val,test}.tsv

Reads every ``<locale-dir>/<lang>/LC_MESSAGES/*.mo`` (``attnseq.data.mo_catalogs``), cleans each
pair (``attnseq.data.message_cleaning``), keeps one translation per English message, filters by
the English side's length in words, and splits by message: each English message is in exactly one
of train/val/test, chosen by a hash of it and the seed. Writes the three splits as
``source<TAB>target`` lines (what ``attnseq.data.tsv`` reads) and ``corpus.json``: the settings,
the catalogs read and how many pairs each rule dropped. It prints the same counts as it goes.
The four files are written into a folder beside ``--out`` and renamed into place as one set
(``replace_folder``), so an interrupted or concurrent build never leaves splits of two builds
together. docs/messages_corpus.md describes the rules.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shlex
import shutil
import signal
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from attnseq.data.message_cleaning import DROP_REASONS, SPLITS, clean_pair, deduplicate, split_by_message, word_count
from attnseq.data.mo_catalogs import Catalog, CatalogFormatError, read_catalog
from attnseq.data.tsv import SPLIT_FILES
from attnseq.errors import ConfigError

DEFAULT_LOCALE_DIR = Path("/usr/share/locale")
LENGTH_HISTOGRAM_BIN = 5  # English words per bin of corpus.json's length histogram
MANIFEST = "corpus.json"
CORPUS_FILES = (*SPLIT_FILES.values(), MANIFEST)
"""Everything a corpus folder holds: a build replaces these four as one set."""
_BUILDING, _REPLACED = "building", "replaced"  # the suffixes of the folders beside --out during a build


def check_output_dir(output_dir: Path, make_parent: bool = False) -> None:
    """Fail before any catalog is read if the corpus cannot be written to ``output_dir``: it is a
    file, it holds files that are not a corpus's (a build replaces the whole folder), or its parent
    is missing (created if ``make_parent``, as for the default folder) or not writable.

    Raises:
        ConfigError: naming the folder and the fix.
    """
    shown, target = shlex.quote(str(output_dir)), output_dir.resolve()
    if target.exists() and not target.is_dir():
        raise ConfigError(
            f"--out {shown} is a file, not a folder: the corpus is a folder of {', '.join(CORPUS_FILES)}",
            "give a folder that is new or holds an earlier corpus, e.g. "
            f"--out {shlex.quote(str(output_dir.parent / 'corpus'))}",
        )
    _refuse_foreign_files(target, shown)
    parent = target.parent
    if make_parent and not parent.exists():
        try:
            parent.mkdir(parents=True)
        except OSError as error:
            raise ConfigError(f"--out {shown}: cannot create its parent folder {parent} ({error.strerror})",
                              "give --out a folder whose parent exists and is writable") from None
    if not parent.is_dir():
        raise ConfigError(
            f"--out {shown}: its parent {parent} is not a folder" if parent.exists()
            else f"--out {shown}: its parent folder {parent} does not exist",
            f"create it first (mkdir -p {shlex.quote(str(parent))}), or correct the path",
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--out {shown}: cannot write in {parent} (the corpus is built beside the folder, then renamed "
            "into place)",
            "give --out a folder whose parent you can write, e.g. --out data/messages_en-fr",
        )


def _refuse_foreign_files(target: Path, shown: str) -> None:
    """``ConfigError`` if the folder ``target`` holds anything but a corpus's files (a build would delete it)."""
    try:
        names = [path.name for path in target.iterdir()] if target.is_dir() else []
    except OSError as error:
        raise ConfigError(f"--out {shown}: cannot list the folder ({error.strerror})",
                          "give --out a folder you can read and write") from None
    others = sorted(name for name in names if name not in CORPUS_FILES)
    if others:
        listed = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ConfigError(
            f"--out {shown} holds files that are not part of a corpus ({listed}); a build replaces the whole folder",
            "give a new folder, or one that holds only an earlier corpus, e.g. "
            f"--out {shlex.quote(str(target / 'corpus'))}",
        )


def replace_folder(target: Path, files: Mapping[str, str]) -> None:
    """Make ``target`` a folder holding exactly ``files`` (name → text), replacing what it held as one set.

    The files are written into a new folder beside ``target``, then, under a lock on the parent
    folder and with SIGINT/SIGTERM held back, the old folder is renamed aside, the new one renamed
    to ``target`` and the old one deleted. So a reader finds the old set whole, then the new set
    whole (a reader that opened the old folder keeps reading the old files it opened, as POSIX
    keeps deleted files that are open); an interrupted build leaves the old folder as it was and
    nothing beside it; of two builds at once, the one that finishes last wins whole. What a build
    killed outright (SIGKILL) left beside ``target`` is deleted by the next one.
    """
    target = target.resolve()
    building = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.{_BUILDING}")
    os.mkdir(building)
    try:
        for name, text in files.items():
            with open(building / name, "w", encoding="utf-8", newline="\n") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())  # on disk before the rename makes it the corpus
        with _locked(target.parent), _signals_held():
            _remove_leftovers(target)
            _refuse_foreign_files(target, shlex.quote(str(target)))  # again: files may have come since the check
            replaced = None
            if target.exists():
                replaced = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.{_REPLACED}")
                os.rename(target, replaced)
            os.rename(building, target)
            if replaced is not None:
                shutil.rmtree(replaced, ignore_errors=True)
    finally:
        shutil.rmtree(building, ignore_errors=True)  # gone already once renamed


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` (flock on the folder itself: no lock file; the kernel drops it
    when its holder dies)."""
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back for the block (a few renames): a signal that lands in it acts
    when it ends, so the swap is never cut between its two renames."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _remove_leftovers(target: Path) -> None:
    """Delete what killed builds left beside ``target`` (call it under the lock): any replaced
    folder (a swap cut by SIGKILL; ``target`` is written right after), and the folders being built
    by processes that no longer exist."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(\d+)-[0-9a-f]+\.({_BUILDING}|{_REPLACED})")
    for path in target.parent.iterdir():
        found = pattern.fullmatch(path.name)
        if found and (found.group(2) == _REPLACED or not _process_exists(int(found.group(1)))):
            shutil.rmtree(path, ignore_errors=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def default_output_dir(lang: str) -> Path:
    return Path("data") / f"messages_en-{lang}"


def languages_with_catalogs(locale_dir: Path) -> dict[str, int]:
    """Each language folder of ``locale_dir`` that holds ``LC_MESSAGES/*.mo``, with how many."""
    if not locale_dir.is_dir():
        return {}
    found = {}
    for folder in sorted(locale_dir.iterdir()):
        count = len(list((folder / "LC_MESSAGES").glob("*.mo"))) if folder.is_dir() else 0
        if count:
            found[folder.name] = count
    return found


def catalog_paths(locale_dir: Path, lang: str) -> list[Path]:
    """The ``.mo`` files of ``lang``, sorted by name.

    Raises:
        ConfigError: there are none; the message lists the languages that have catalogs and says
            how to get some.
    """
    paths = sorted((locale_dir / lang / "LC_MESSAGES").glob("*.mo"))
    if paths:
        return paths
    others = languages_with_catalogs(locale_dir)
    where = f"{locale_dir / lang / 'LC_MESSAGES'}"
    if others:
        listed = ", ".join(f"{name} ({count})" for name, count in others.items())
        found = f"Languages with catalogs under {locale_dir} (catalogs each): {listed}."
    else:
        found = f"No language under {locale_dir} has any catalog."
    raise ConfigError(
        f"no gettext catalogs (*.mo) for language {lang!r}: {where} holds none. {found}",
        "choose one of those languages with --lang, or install packages that ship translations "
        "(on Debian/Ubuntu they come with the packages themselves, e.g. `apt-get install coreutils bash "
        "tar grep`, unless the image removes /usr/share/locale: check /etc/dpkg/dpkg.cfg.d/ for a "
        "path-exclude of it), or point --locale-dir at another tree that holds <lang>/LC_MESSAGES/*.mo.",
    )


def read_catalogs(paths: Sequence[Path], log=print) -> tuple[list[Catalog], list[str]]:
    """The catalogs of ``paths`` that can be read, and a line for each that cannot."""
    catalogs, unreadable = [], []
    for path in paths:
        try:
            catalogs.append(read_catalog(path))
        except (OSError, CatalogFormatError) as error:
            unreadable.append(str(error))
            log(f"  skipped {path.name}: {error}")
    return catalogs, unreadable


def length_histogram(pairs: Sequence[tuple[str, str]], bin_width: int = LENGTH_HISTOGRAM_BIN) -> dict[str, int]:
    """How many pairs have 1–5, 6–10, … English words."""
    bins = Counter((word_count(source) - 1) // bin_width for source, _ in pairs)
    return {f"{b * bin_width + 1}-{(b + 1) * bin_width}": bins[b] for b in sorted(bins)}


def build_corpus(
    lang: str,
    locale_dir: Path = DEFAULT_LOCALE_DIR,
    output_dir: Path | None = None,
    seed: int = 0,
    min_words: int = 1,
    max_words: int = 30,
    val_fraction: float = 0.05,
    test_fraction: float = 0.05,
    log=print,
) -> dict:
    """Build the corpus of ``lang`` into ``output_dir`` and return what ``corpus.json`` holds.

    Raises:
        ConfigError: a setting out of range, or no catalogs for ``lang`` under ``locale_dir``.
    """
    _check_settings(min_words, max_words, val_fraction, test_fraction)
    locale_dir = Path(locale_dir)
    default = output_dir is None
    output_dir = default_output_dir(lang) if default else Path(output_dir)
    check_output_dir(output_dir, make_parent=default)
    paths = catalog_paths(locale_dir, lang)
    catalogs, unreadable = read_catalogs(paths, log=log)
    reading = sum((catalog.counts for catalog in catalogs), Counter())
    log(f"catalogs: {len(catalogs)} read from {locale_dir / lang / 'LC_MESSAGES'}"
        + (f", {len(unreadable)} unreadable" if unreadable else ""))
    log(f"pairs read: {reading['pairs']} (entries {reading['entries']}: header {reading['header']}, "
        f"untranslated {reading['untranslated']}, undecodable {reading['undecodable']}; "
        f"context stripped {reading['context_stripped']}, plural → singular {reading['plural_singular_kept']})")

    dropped = Counter({reason: 0 for reason in DROP_REASONS})
    cleaned = []
    for catalog in catalogs:
        for pair in catalog.pairs:
            result = clean_pair(pair.source, pair.target)
            if isinstance(result, str):
                dropped[result] += 1
                continue
            words = word_count(result[0])
            if words < min_words:
                dropped["too_short"] += 1
            elif words > max_words:
                dropped["too_long"] += 1
            else:
                cleaned.append(result)
    for reason in DROP_REASONS:
        log(f"  dropped {reason}: {dropped[reason]}")
    kept = deduplicate(cleaned)
    dropped["duplicate"] = len(cleaned) - len(kept)
    log(f"  dropped duplicate (same English message): {dropped['duplicate']}")
    log(f"kept: {len(kept)} pairs")

    splits = split_by_message(kept, seed=seed, val_fraction=val_fraction, test_fraction=test_fraction)
    summary = {
        "language": lang,
        "source_language": "en",
        "locale_dir": str(locale_dir),
        "settings": {"seed": seed, "min_words": min_words, "max_words": max_words,
                     "val_fraction": val_fraction, "test_fraction": test_fraction},
        "catalogs": {catalog.name: catalog.counts["pairs"] for catalog in catalogs},
        "unreadable_catalogs": unreadable,
        "read": {key: reading[key] for key in sorted(reading)},
        "dropped": dict(dropped),
        "kept": len(kept),
        "splits": {split: len(splits[split]) for split in SPLITS},
        "source_words": length_histogram(kept),
    }
    files = {SPLIT_FILES[split]: "".join(f"{source}\t{target}\n" for source, target in splits[split])
             for split in SPLITS}
    files[MANIFEST] = json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
    replace_folder(output_dir, files)
    log("splits (by English message): " + ", ".join(f"{split} {len(splits[split])}" for split in SPLITS))
    log(f"wrote {output_dir.resolve()}/{{train,val,test}}.tsv and corpus.json")
    return summary


def _check_settings(min_words: int, max_words: int, val_fraction: float, test_fraction: float) -> None:
    if not 1 <= min_words <= max_words:
        raise ConfigError(
            f"--min-words {min_words} and --max-words {max_words} leave no length to keep",
            "use 1 <= --min-words <= --max-words, e.g. --min-words 1 --max-words 30",
        )
    if not (0 < val_fraction and 0 < test_fraction and val_fraction + test_fraction < 1):
        raise ConfigError(
            f"--val-fraction {val_fraction} and --test-fraction {test_fraction} must each be above 0 "
            "and leave some messages for training",
            "use fractions such as --val-fraction 0.05 --test-fraction 0.05",
        )
