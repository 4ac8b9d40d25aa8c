"""The messages corpus builder: reading .mo catalogs, each cleaning rule, the split by message, the CLI."""

from __future__ import annotations

import gettext
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import BUILD_CORPUS_PY  # noqa: E402  (tests/ is on sys.path under pytest)
from mo_writer import mo_bytes, write_mo  # noqa: E402

from attnseq.data import message_cleaning as cleaning
from attnseq.data.messages import build_corpus, catalog_paths
from attnseq.data.mo_catalogs import CatalogFormatError, read_catalog
from attnseq.data.tsv import read_tsv
from attnseq.errors import ConfigError

REAL_FRENCH_CATALOGS = Path("/usr/share/locale/fr/LC_MESSAGES")

ENTRIES = [
    ("Open file", "Ouvrir le fichier"),
    ("menu\x04_Quit", "_Quitter"),  # a context
    ("%d file\x00%d files", "%d fichier\x00%d fichiers"),  # a plural entry
    ("Not translated yet", ""),
]


def quiet(line: str) -> None:
    pass


# -- reading .mo files ------------------------------------------------------------------------------


def test_read_catalog_skips_the_header_strips_contexts_and_keeps_the_singular_of_plurals(tmp_path):
    catalog = read_catalog(write_mo(tmp_path / "demo.mo", ENTRIES))
    pairs = {(pair.source, pair.target) for pair in catalog.pairs}
    assert pairs == {("Open file", "Ouvrir le fichier"), ("_Quit", "_Quitter"), ("%d file", "%d fichier")}
    assert catalog.name == "demo"
    counts = catalog.counts
    assert (counts["entries"], counts["header"], counts["pairs"]) == (5, 1, 3)
    assert (counts["context_stripped"], counts["plural_singular_kept"], counts["untranslated"]) == (1, 1, 1)


def test_read_catalog_agrees_with_python_gettext(tmp_path):
    entries = [("Save", "Enregistrer"), ("Delete «%s»?", "Supprimer « %s » ?"), ("Élan", "Élan vital")]
    data = mo_bytes(entries)
    catalog = read_catalog(write_mo(tmp_path / "x.mo", entries))
    reference = gettext.GNUTranslations(io.BytesIO(data))
    assert {pair.source: pair.target for pair in catalog.pairs} == {
        msgid: reference.gettext(msgid) for msgid, _ in entries
    }


def test_read_catalog_reads_big_endian_files_and_the_header_charset(tmp_path):
    entries = [("Caf\u00e9", "Caf\u00e9 cr\u00e8me")]
    big = read_catalog(write_mo(tmp_path / "big.mo", entries, byte_order=">"))
    latin = read_catalog(write_mo(tmp_path / "latin.mo", entries, charset="ISO-8859-1"))
    assert (tmp_path / "latin.mo").read_bytes().count("é".encode("latin-1")) == 2
    assert [(p.source, p.target) for p in big.pairs] == [("Café", "Café crème")]
    assert [(p.source, p.target) for p in latin.pairs] == [("Café", "Café crème")]


def test_read_catalog_rejects_a_file_that_is_not_a_catalog(tmp_path):
    path = tmp_path / "bad.mo"
    path.write_bytes(b"\x00" * 40)
    with pytest.raises(CatalogFormatError, match="not a .mo file"):
        read_catalog(path)
    path.write_bytes(b"short")
    with pytest.raises(CatalogFormatError, match="shorter than"):
        read_catalog(path)


# -- the cleaning rules -----------------------------------------------------------------------------


def test_has_tab():
    assert cleaning.has_tab("a\tb") and not cleaning.has_tab("a b")


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        (("_File", "_Fichier"), None, ("File", "Fichier")),
        (("Save _As", "Enregistrer _sous"), None, ("Save As", "Enregistrer sous")),
        (("E_xit", "_Quitter"), None, ("Exit", "Quitter")),
        (("_Add to Bookmarks", "A_jouter aux signets"), None, ("Add to Bookmarks", "Ajouter aux signets")),
        (("&Help", "&Aide"), None, ("Help", "Aide")),
        (("_Name:", "Nom :"), None, ("Name:", "Nom :")),  # the translator left the mnemonic out
        # identifiers, not mnemonics: inside a lower-case or all-capitals word, or the same on both sides
        (("invalid max_depth", "max_depth non valable"), None, ("invalid max_depth", "max_depth non valable")),
        (("lextypes_function", "fonction_lextypes"), None, ("lextypes_function", "fonction_lextypes")),
        (("DT_NEEDED is set", "DT_NEEDED est défini"), None, ("DT_NEEDED is set", "DT_NEEDED est défini")),
        (("linking of _sym to", "liens de _sym vers"), None, ("linking of _sym to", "liens de _sym vers")),
        (("AT&T syntax", "syntaxe AT&T"), None, ("AT&T syntax", "syntaxe AT&T")),
        (("escape as &amp;", "échapper avec &amp;"), None, ("escape as &amp;", "échapper avec &amp;")),
        # two candidate marks: not a label with one mnemonic
        (("_a and _b", "_a et _b"), None, ("_a and _b", "_a et _b")),
        # no mnemonic in the English message: the translation is left alone
        (("Use fr_FR", "Utiliser _fr"), None, ("Use fr_FR", "Utiliser _fr")),
    ],
)
def test_strip_accelerators(source, target, expected):
    assert cleaning.strip_accelerators(*source) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<b>Output Quality</b>", "Output Quality"),
        ('<span weight="bold">Describe</span> it', "Describe it"),
        ("first<br/>second", "first second"),
        ("usage: git add <file>", "usage: git add <file>"),  # a metavariable, never closed
        ("<b>Copy</b> <file>", "Copy <file>"),
        ('The "&lt; &gt;" key &amp; more', 'The "< >" key & more'),
    ],
)
def test_strip_markup(text, expected):
    assert cleaning.strip_markup(text) == expected


def test_has_placeholder_lookalike():
    assert cleaning.has_placeholder_lookalike("value PH3 is set")
    assert not cleaning.has_placeholder_lookalike("GRAPH1 and PHONE are words")


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        ("open %s: %m", "ouvrir %s : %m", ("open PH1: PH2", "ouvrir PH1 : PH2")),
        # reordered arguments keep their tokens
        ("%s of %d bytes", "%2$d octets de %1$s", ("PH1 of PH2 bytes", "PH2 octets de PH1")),
        ("copy %1$s to %2$s", "copier vers %2$s depuis %1$s", ("copy PH1 to PH2", "copier vers PH2 depuis PH1")),
        # a * width takes an argument before the value it pads
        ("%*d items in %s", "%3$s contient %2$*1$d éléments", ("PH1 items in PH2", "PH2 contient PH1 éléments")),
        ('"%.*s" at %lu', "« %.*s » à %lu", ('"PH1" at PH2', "« PH1 » à PH2")),
        ("size %<PRIu64> of %s", "taille %<PRIu64> de %s", ("size PH1 of PH2", "taille PH1 de PH2")),
        ("%(count)d of %(name)s", "%(name)s : %(count)d", ("PH1 of PH2", "PH2 : PH1")),
        ("{0} and {name}", "{name} et {0}", ("PH1 and PH2", "PH2 et PH1")),
        ("{} then {}", "{1} après {0}", ("PH1 then PH2", "PH2 après PH1")),
        ("set $HOME or ${XDG_HOME}", "définir ${XDG_HOME} ou $HOME", ("set PH1 or PH2", "définir PH2 ou PH1")),
        ("100%% done", "100 %% fait", ("100% done", "100 % fait")),
        # a placeholder touching a letter, digit or another placeholder is set apart by a space
        ("%s%s: at 0x%08lx", "%s%s : à 0x%08lx", ("PH1 PH2: at 0x PH3", "PH1 PH2 : à 0x PH3")),
        ("%pB: bad %pA", "%pB : %pA invalide", ("PH1: bad PH2", "PH1 : PH2 invalide")),
        # the two sides refer to different arguments: not a faithful pair
        ("cannot write %s: %m", "impossible d'écrire « %s »", None),
        ("%d old entries", "une entrée", None),
        ("$line $filename", "$ligne $nomfichier", None),
    ],
)
def test_replace_placeholders(source, target, expected):
    assert cleaning.replace_placeholders(source, target) == expected


def test_unwrap_lines():
    assert cleaning.unwrap_lines("one\ntwo\r\nthree\rfour") == "one two three four"


def test_normalise_spaces_turns_french_no_break_spaces_into_plain_ones():
    text = "  Erreur\u00a0: «\u202fPH1\u202f»\u2009!\n\tfin  "
    assert cleaning.normalise_spaces(text) == "Erreur : « PH1 » ! fin"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("PH1: PH2", False), ("...", False), ("100 % 2", False), ("", False), ("PH1 file", True), ("é", True)],
)
def test_has_words(text, expected):
    assert cleaning.has_words(text) is expected


def test_is_untranslated_ignores_case():
    assert cleaning.is_untranslated("Position", "Position")
    assert cleaning.is_untranslated("Musi", "musi")
    assert not cleaning.is_untranslated("File", "Fichier")


def test_word_count():
    assert cleaning.word_count(" cannot  open PH1 ") == 3


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        ("a\tb", "c d", "tab"),
        ("set PH2 now", "définir PH2", "placeholder_lookalike"),
        ("write %s", "écrire", "placeholder_mismatch"),
        ("%s: %s", "%s : %s", "no_words"),
        ("<b>Note</b>", "<b>Note</b>", "untranslated"),
        (
            "<b>_Open</b> %s\nnow",
            "<b>_Ouvrir</b>\u00a0%s\nmaintenant",
            ("Open PH1 now", "Ouvrir PH1 maintenant"),
        ),
    ],
)
def test_clean_pair_applies_the_rules_in_order_and_names_the_one_that_drops(source, target, expected):
    assert cleaning.clean_pair(source, target) == expected


def test_deduplicate_keeps_the_most_frequent_translation_then_the_first_in_sorted_order():
    pairs = [("Open", "Ouvrir"), ("Close", "Fermer"), ("Open", "Ouvre"), ("Open", "Ouvrir"), ("Close", "Clore")]
    assert cleaning.deduplicate(pairs) == [("Close", "Clore"), ("Open", "Ouvrir")]
    assert cleaning.deduplicate(reversed(pairs)) == [("Close", "Clore"), ("Open", "Ouvrir")]


def test_split_by_message_puts_each_message_in_one_split_deterministically():
    pairs = [(f"message {i}", f"message {i} traduit") for i in range(2000)]
    splits = cleaning.split_by_message(pairs, seed=3, val_fraction=0.1, test_fraction=0.1)
    sources = {name: {source for source, _ in split} for name, split in splits.items()}
    assert sum(len(split) for split in splits.values()) == 2000
    assert not sources["train"] & sources["val"]
    assert not sources["train"] & sources["test"]
    assert not sources["val"] & sources["test"]
    assert 150 < len(splits["val"]) < 250 and 150 < len(splits["test"]) < 250  # 200 expected of each
    assert splits == cleaning.split_by_message(list(reversed(pairs)), seed=3, val_fraction=0.1, test_fraction=0.1)
    for name, split in splits.items():
        assert all(cleaning.split_of(source, 3, 0.1, 0.1) == name for source, _ in split)
    other_seed = cleaning.split_by_message(pairs, seed=4, val_fraction=0.1, test_fraction=0.1)
    assert {source for source, _ in other_seed["val"]} != sources["val"]


def test_adding_messages_does_not_move_the_ones_already_split():
    pairs = [(f"message {i}", f"traduit {i}") for i in range(500)]
    before = cleaning.split_by_message(pairs, seed=0, val_fraction=0.1, test_fraction=0.1)
    after = cleaning.split_by_message(pairs + [(f"new {i}", f"nouveau {i}") for i in range(300)],
                                      seed=0, val_fraction=0.1, test_fraction=0.1)
    for name in cleaning.SPLITS:
        assert set(before[name]) <= set(after[name])


# -- the builder and its command line ---------------------------------------------------------------


def fake_locale_tree(root: Path) -> Path:
    """Two French catalogs (one with a duplicate of the other's message) and a German one."""
    write_mo(root / "fr" / "LC_MESSAGES" / "tool.mo", [
        ("Open file", "Ouvrir le fichier"),
        ("cannot open %s: %m", "impossible d'ouvrir %s\u00a0: %m"),
        ("_Quit", "_Quitter"),
        ("%s: %s", "%s\u00a0: %s"),  # no words
        ("Position", "Position"),  # untranslated
        ("column\tone", "colonne\tun"),  # tab
        ("copy %s to %s", "copier %s"),  # placeholders differ
        ("one two three four five six", "un deux trois quatre cinq six"),  # too long for --max-words 5
        ("%d file\x00%d files", "%d fichier\x00%d fichiers"),
    ])
    write_mo(root / "fr" / "LC_MESSAGES" / "other.mo", [
        ("Open file", "Ouvrir un fichier"),
        ("Save\nall", "Tout\nenregistrer"),
    ] + [(f"Message number {i}", f"Message numéro {i}") for i in range(40)])
    write_mo(root / "de" / "LC_MESSAGES" / "tool.mo", [("Open file", "Datei öffnen")])
    return root


def test_build_corpus_writes_the_splits_and_counts_every_rule(tmp_path):
    locale_dir = fake_locale_tree(tmp_path / "locale")
    lines = []
    summary = build_corpus("fr", locale_dir=locale_dir, output_dir=tmp_path / "out", max_words=5,
                           val_fraction=0.2, test_fraction=0.2, log=lines.append)
    assert summary["catalogs"] == {"other": 42, "tool": 9}
    assert summary["dropped"] == {"tab": 1, "placeholder_lookalike": 0, "placeholder_mismatch": 1, "no_words": 1,
                                  "untranslated": 1, "too_short": 0, "too_long": 1, "duplicate": 1}
    assert summary["kept"] == 51 - 5 - 1 == sum(summary["splits"].values())
    written = {}
    for split in cleaning.SPLITS:
        examples = read_tsv(tmp_path / "out" / f"{split}.tsv", tokenizer="word", lowercase=False)
        assert len(examples) == summary["splits"][split] > 0
        written.update({" ".join(e.src): " ".join(e.tgt) for e in examples})
    assert written["Open file"] == "Ouvrir le fichier"  # the tie between the two catalogs, by sorted order
    assert written["cannot open PH1 : PH2"] == "impossible d'ouvrir PH1 : PH2"
    assert written["Quit"] == "Quitter" and written["Save all"] == "Tout enregistrer"
    assert written["PH1 file"] == "PH1 fichier"
    assert json.loads((tmp_path / "out" / "corpus.json").read_text()) == summary
    assert any("dropped untranslated: 1" in line for line in lines) and any("kept: 45" in line for line in lines)


def test_no_catalogs_names_the_languages_found_and_what_to_install(tmp_path):
    locale_dir = fake_locale_tree(tmp_path / "locale")
    with pytest.raises(ConfigError) as caught:
        catalog_paths(locale_dir, "pt_BR")
    message = str(caught.value)
    assert "'pt_BR'" in message and "de (1), fr (2)" in message
    assert "apt-get install" in message and "--locale-dir" in message


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BUILD_CORPUS_PY), *args],
                          capture_output=True, text=True, timeout=120)


def test_the_command_line_builds_the_corpus_and_exits_2_without_catalogs(tmp_path):
    locale_dir = fake_locale_tree(tmp_path / "locale")
    done = run_cli("--lang", "fr", "--locale-dir", str(locale_dir), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [
        "corpus.json", "test.tsv", "train.tsv", "val.tsv"]
    assert "catalogs: 2 read" in done.stdout and "dropped tab: 1" in done.stdout
    missing = run_cli("--lang", "xx", "--locale-dir", str(locale_dir), "--out", str(tmp_path / "none"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: no gettext catalogs (*.mo) for language 'xx'")
    assert "de (1), fr (2)" in missing.stderr and "Fix:" in missing.stderr
    assert not (tmp_path / "none").exists()


def test_the_installed_french_catalogs_give_a_corpus_of_thousands_of_pairs(tmp_path):
    """On a machine with French translations installed, the real corpus; elsewhere the fake tree."""
    if REAL_FRENCH_CATALOGS.is_dir() and any(REAL_FRENCH_CATALOGS.glob("*.mo")):
        locale_dir, least = REAL_FRENCH_CATALOGS.parents[1], 5000
    else:
        locale_dir, least = fake_locale_tree(tmp_path / "locale"), 40
    summary = build_corpus("fr", locale_dir=locale_dir, output_dir=tmp_path / "out", log=quiet)
    assert summary["kept"] > least
    train = (tmp_path / "out" / "train.tsv").read_text(encoding="utf-8").splitlines()
    val = (tmp_path / "out" / "val.tsv").read_text(encoding="utf-8").splitlines()
    assert all(line.count("\t") == 1 for line in train + val)
    assert not {line.split("\t")[0] for line in train} & {line.split("\t")[0] for line in val}


def test_the_corpus_folder_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """An interruption while the new set is written (Ctrl-C, a full disk) keeps the previous folder as
    it was and leaves nothing beside it; a finished build replaces all four files at once."""
    from attnseq.data.messages import replace_folder

    target = tmp_path / "corpus"
    old = {"train.tsv": "old\tancien\n", "val.tsv": "v\tv\n", "test.tsv": "t\tt\n", "corpus.json": "{}\n"}
    replace_folder(target, old)
    new = {name: text.replace("\n", " new\n") for name, text in old.items()}

    class Interrupted(KeyboardInterrupt):
        pass

    import attnseq.data.messages as messages

    real_fsync, calls = messages.os.fsync, []

    def interrupted_at_the_third(descriptor):
        calls.append(descriptor)
        if len(calls) == 3:  # two new files written aside, the signal lands
            raise Interrupted
        real_fsync(descriptor)

    monkeypatch.setattr(messages.os, "fsync", interrupted_at_the_third)
    with pytest.raises(Interrupted):
        replace_folder(target, new)
    monkeypatch.undo()
    assert {path.name: path.read_text(encoding="utf-8") for path in target.iterdir()} == old
    assert [path.name for path in tmp_path.iterdir()] == ["corpus"]
    replace_folder(target, new)
    assert {path.name: path.read_text(encoding="utf-8") for path in target.iterdir()} == new
    assert [path.name for path in tmp_path.iterdir()] == ["corpus"]
