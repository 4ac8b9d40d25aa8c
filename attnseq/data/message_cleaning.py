"""Cleaning gettext message pairs into sentence pairs a translator would accept as training text.

Each rule is one function; ``clean_pair`` applies them in this order and names the rule that drops
a pair:

1. ``has_tab``: a pair with a tab on either side is dropped (tab-aligned tables, and the TSV's
   column separator).
2. ``strip_accelerators``: keyboard mnemonics (``_File``, ``&Help``, ``E_xit``) are removed.
3. ``strip_markup``: Pango/HTML tags that come in open/close pairs (``<b>…</b>``) and ``<br/>``
   are removed, the five XML entities (``&lt;`` …) become their characters. A lone ``<file>`` is a
   metavariable translators translate, and stays.
4. ``has_placeholder_lookalike``: a pair that already holds a word of the placeholder-token form
   (``PH1``) is dropped, so every such token in the corpus is a placeholder.
5. ``replace_placeholders``: printf (``%s``, ``%1$s``, ``%.*s``, ``%<PRIu64>``), Python
   (``%(name)s``, ``{0}``, ``{name}``) and shell (``$VAR``, ``${VAR}``) placeholders become
   ``PH1``, ``PH2``, … numbered in order of first appearance on the English side; the translation
   gets the token of the same argument. A pair whose two sides do not refer to the same arguments
   is dropped. ``%%`` becomes ``%``.
6. ``unwrap_lines`` and ``normalise_spaces``: newlines, tabs, no-break and thin spaces (French puts
   U+00A0/U+202F before ``; : ! ?`` and inside « ») become plain spaces, runs of spaces one,
   and the ends are trimmed.
7. ``has_words``: a side with no letter left outside placeholders (``%s: %s``, ``...``, ``100``) is
   dropped.
8. ``is_untranslated``: a pair whose sides are equal ignoring case is dropped.
9. The length filter on the English side's words (``word_count``) is the caller's.

``deduplicate`` then keeps one translation per English message.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Iterable

PLACEHOLDER_PREFIX = "PH"
"""Placeholders become ``PH1``, ``PH2``, …: letters and digits only, so the word tokenizer keeps
each as one token and a subword vocabulary sees the same string on both sides."""
PLACEHOLDER_TOKEN = re.compile(rf"\b{PLACEHOLDER_PREFIX}\d+\b")

DROP_REASONS = (
    "tab",
    "placeholder_lookalike",
    "placeholder_mismatch",
    "no_words",
    "untranslated",
    "too_short",
    "too_long",
)
"""Why ``clean_pair`` (and the length filter) drop a pair, in the order the rules run."""


def placeholder_token(number: int) -> str:
    return f"{PLACEHOLDER_PREFIX}{number}"


# -- 1. tabs ---------------------------------------------------------------------------------------


def has_tab(text: str) -> bool:
    """Whether ``text`` holds a tab: tab-aligned help tables, and the TSV's own column separator."""
    return "\t" in text


# -- 2. keyboard accelerators ----------------------------------------------------------------------

_MARK = re.compile(r"[_&](?=[^\W_])")  # an underscore or ampersand before a letter or digit
_ENTITY = re.compile(r"&(?:#\d+|#x[0-9A-Fa-f]+|\w+);")


def _word_at(text: str, index: int) -> str:
    start = index
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    end = index
    while end < len(text) and not text[end].isspace():
        end += 1
    return text[start:end]


def _is_mnemonic_in_english(text: str, index: int) -> bool:
    """A mark that starts a word (``_File``, ``Save _As``) or sits inside a capitalised word before
    a lower-case letter (``E_xit``); not one inside an identifier (``max_depth``, ``DT_NEEDED``)."""
    if index == 0 or not (text[index - 1].isalnum() or text[index - 1] in "_&"):
        return True
    start = index
    while start > 0 and text[start - 1].isalpha():
        start -= 1
    prefix = text[start:index]
    starts_word = start == 0 or text[start - 1].isspace()
    capitalised = prefix[:1].isupper() and (len(prefix) == 1 or prefix[1:].islower())
    return starts_word and capitalised and index + 1 < len(text) and text[index + 1].islower()


def _marks(text: str) -> list[int]:
    return [m.start() for m in _MARK.finditer(text) if not _ENTITY.match(text, m.start())]


def _strip_mark(text: str, index: int | None, other: str) -> str:
    if index is None or _word_at(text, index) in other.split():
        return text  # the same word on the other side: an identifier, not a mnemonic
    return text[:index] + text[index + 1 :]


def strip_accelerators(source: str, target: str) -> tuple[str, str]:
    """Both sides without their keyboard mnemonic (``_Open``/``_Ouvrir``, ``&Help``/``&Aide``).

    A mnemonic belongs to the English message: the English side must hold exactly one mark that
    reads as one (see ``_is_mnemonic_in_english``), and only then is the translation's single
    ``_``/``&`` before a letter removed too, wherever the translator put it (``É_jecter``). A mark
    whose word appears unchanged on the other side is kept (an identifier such as ``KEY_NAME``);
    ``&amp;`` and other entities are not marks.
    """
    english = [index for index in _marks(source) if _is_mnemonic_in_english(source, index)]
    if len(english) != 1:
        return source, target
    stripped_source = _strip_mark(source, english[0], target)
    if stripped_source == source:
        return source, target
    translated = _marks(target)
    stripped_target = _strip_mark(target, translated[0] if len(translated) == 1 else None, source)
    return stripped_source, stripped_target


# -- 3. markup -------------------------------------------------------------------------------------

_TAG = re.compile(r"<(/?)([A-Za-z][\w-]*)(?:\s[^<>]*)?(/?)>")
_XML_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}
_XML_ENTITY = re.compile(r"&(lt|gt|amp|quot|apos);")


def strip_markup(text: str) -> str:
    """``text`` without the tags that come in pairs (``<b>…</b>``, ``<span …>…</span>``) or are line
    breaks (``<br/>``), and with ``&lt; &gt; &amp; &quot; &apos;`` as the characters they stand for.

    A tag name never closed in ``text`` (``<file>``, ``<name>``) is a metavariable, not markup: it
    stays, and is translated like the words around it.
    """
    closed = {name for slash, name, _ in _TAG.findall(text) if slash}

    def drop(match: re.Match) -> str:
        slash, name, self_closing = match.groups()
        if name.lower() == "br":
            return " "
        return "" if name in closed else match.group(0)

    text = _TAG.sub(drop, text)
    return _XML_ENTITY.sub(lambda match: _XML_ENTITIES[match.group(1)], text)


# -- 4./5. placeholders ----------------------------------------------------------------------------

_PLACEHOLDER = re.compile(
    r"""
    (?P<percent>%%)
  | %\((?P<python_name>\w+)\)[-+#0]*\d*(?:\.\d+)?[A-Za-z]
  | %(?:(?P<position>\d+)\$)?[-+#0]*(?P<width>\*(?:\d+\$)?|\d+)?(?:\.(?P<precision>\*(?:\d+\$)?|\d*))?
        (?:<(?P<inttypes>PRI\w+)>|(?:hh|h|ll|l|L|q|j|z|Z|t)?(?P<conversion>p[A-Z]|[A-Za-z]))
  | \{(?P<brace>\d*|[A-Za-z_]\w*)(?:![rsa])?(?::[^{}]*)?\}
  | \$(?:\{(?P<shell_braced>[A-Za-z_]\w*)\}|(?P<shell>[A-Za-z_]\w*))
    """,
    re.VERBOSE,
)


def has_placeholder_lookalike(text: str) -> bool:
    """Whether ``text`` already holds a word of the placeholder-token form (``PH1``), which the
    placeholder tokens would then be confused with."""
    return PLACEHOLDER_TOKEN.search(text) is not None


def _placeholders(text: str) -> list[tuple[re.Match, tuple | None]]:
    """Each placeholder of ``text`` with the argument it refers to (None for ``%%``).

    Unnumbered printf directives take the next argument (a ``*`` width or precision takes one
    before it; ``%m``, glibc's error text, takes none); ``%2$s`` names the second (and ``%3$.*2$s``
    the third, with the second as its precision); an empty ``{}`` takes the next positional field.
    """
    found = []
    next_printf = 0
    next_brace = 0
    for match in _PLACEHOLDER.finditer(text):
        groups = match.groupdict()
        if groups["percent"]:
            found.append((match, None))
        elif groups["python_name"]:
            found.append((match, ("python", groups["python_name"])))
        elif groups["inttypes"] or groups["conversion"]:
            if groups["position"]:
                argument = int(groups["position"])
            elif groups["conversion"] == "m":
                argument = "errno"
            else:
                next_printf += (groups["width"] == "*") + (groups["precision"] == "*") + 1
                argument = next_printf
            found.append((match, ("printf", argument)))
        elif groups["brace"] is not None:
            field = groups["brace"]
            if field == "":
                field, next_brace = next_brace, next_brace + 1
            elif field.isdigit():
                field = int(field)
            found.append((match, ("brace", field)))
        else:
            found.append((match, ("shell", groups["shell"] or groups["shell_braced"])))
    return found


def _is_word_character(character: str) -> bool:
    return character.isalnum() or character == "_"


def _substitute(text: str, found: list[tuple[re.Match, tuple | None]], tokens: dict) -> str:
    """``text`` with each placeholder found replaced by its argument's token, set apart by a space
    where it would touch a letter, a digit or another token (``%s%s`` → ``PH1 PH2``, ``0x%x`` → ``0x PH1``)."""
    result = ""
    end = 0
    for match, argument in found:
        result += text[end : match.start()]
        end = match.end()
        if argument is None:
            result += "%"
            continue
        if _is_word_character(result[-1:]):
            result += " "
        result += tokens[argument]
        if _is_word_character(text[end : end + 1]):
            result += " "
    return result + text[end:]


def replace_placeholders(source: str, target: str) -> tuple[str, str] | None:
    """Both sides with each placeholder replaced by ``PH<n>``, or None when the sides disagree.

    ``n`` numbers the arguments in the order the English side first uses them; the translation's
    placeholders get the number of the argument they refer to, so ``%1$s … %2$s`` reordered as
    ``%2$s … %1$s`` reads ``PH2 … PH1``. None when the two sides do not use the same set of
    arguments (a translation that drops or adds one is not a faithful pair).
    """
    source_found, target_found = _placeholders(source), _placeholders(target)
    source_arguments = [argument for _, argument in source_found if argument is not None]
    target_arguments = {argument for _, argument in target_found if argument is not None}
    if set(source_arguments) != target_arguments:
        return None
    tokens = {}
    for argument in source_arguments:
        tokens.setdefault(argument, placeholder_token(len(tokens) + 1))
    return _substitute(source, source_found, tokens), _substitute(target, target_found, tokens)


# -- 6. whitespace ---------------------------------------------------------------------------------

_SPACES = re.compile(r"[\s\u00a0\u2007\u2009\u202f]+")


def unwrap_lines(text: str) -> str:
    """``text`` as one line: every line break (``\\n``, ``\\r\\n``, ``\\r``) becomes a space."""
    return re.sub(r"\r\n|[\r\n\u2028\u2029]", " ", text)


def normalise_spaces(text: str) -> str:
    """``text`` with every run of spaces — tabs, no-break (U+00A0), figure (U+2007), thin (U+2009)
    and narrow no-break (U+202F) spaces included — as one plain space, and no space at either end.
    French typography's « %s » and ``Erreur :`` keep their spaces, as ordinary ones."""
    return _SPACES.sub(" ", text).strip()


# -- 7./8./9. what is left -------------------------------------------------------------------------


def has_words(text: str) -> bool:
    """Whether ``text`` holds a letter outside its placeholder tokens (``PH1: PH2``, ``...``,
    ``100 %`` do not)."""
    return any(character.isalpha() for character in PLACEHOLDER_TOKEN.sub("", text))


def is_untranslated(source: str, target: str) -> bool:
    """Whether the translation repeats the English message, ignoring case (``Position``/``Position``,
    ``Musi``/``musi``): a copy, not a translation."""
    return source.casefold() == target.casefold()


def word_count(text: str) -> int:
    """Words of ``text``, split at spaces: what the length filter counts on the English side."""
    return len(text.split())


def clean_pair(source: str, target: str) -> tuple[str, str] | str:
    """The cleaned ``(source, target)``, or the name (from ``DROP_REASONS``) of the rule that drops it."""
    if has_tab(source) or has_tab(target):
        return "tab"
    source, target = strip_accelerators(source, target)
    source, target = strip_markup(source), strip_markup(target)
    if has_placeholder_lookalike(source) or has_placeholder_lookalike(target):
        return "placeholder_lookalike"
    replaced = replace_placeholders(source, target)
    if replaced is None:
        return "placeholder_mismatch"
    source, target = (normalise_spaces(unwrap_lines(side)) for side in replaced)
    if not (has_words(source) and has_words(target)):
        return "no_words"
    if is_untranslated(source, target):
        return "untranslated"
    return source, target


# -- deduplication and the split -------------------------------------------------------------------


def deduplicate(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """One pair per English message: its most frequent translation, ties broken by sorted order.

    The result is sorted by English message, so it does not depend on the order catalogs were read.
    """
    translations: dict[str, Counter] = defaultdict(Counter)
    for source, target in pairs:
        translations[source][target] += 1
    return [
        (source, min(counts, key=lambda target: (-counts[target], target)))
        for source, counts in sorted(translations.items())
    ]


SPLITS = ("train", "val", "test")


def split_of(source: str, seed: int, val_fraction: float, test_fraction: float) -> str:
    """``train``, ``val`` or ``test`` for the English message ``source``, from a hash of it and the seed.

    The same message always lands in the same split, whatever else the corpus holds: adding a
    catalog adds messages to the splits without moving the ones already there.
    """
    return SPLITS[_split_index(_position(source, seed), val_fraction, test_fraction)]


def _position(source: str, seed: int) -> float:
    digest = hashlib.sha256(f"{seed}\x00{source}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _split_index(position: float, val_fraction: float, test_fraction: float) -> int:
    if position < val_fraction:
        return 1
    if position < val_fraction + test_fraction:
        return 2
    return 0


def split_by_message(
    pairs: Iterable[tuple[str, str]], seed: int, val_fraction: float, test_fraction: float
) -> dict[str, list[tuple[str, str]]]:
    """The pairs in ``train``/``val``/``test`` by ``split_of`` their English message, each split in
    the order of the hash (a fixed shuffle, so a split's first lines are not all one catalog's)."""
    placed: dict[str, list[tuple[float, tuple[str, str]]]] = {split: [] for split in SPLITS}
    for source, target in pairs:
        position = _position(source, seed)
        placed[SPLITS[_split_index(position, val_fraction, test_fraction)]].append((position, (source, target)))
    return {split: [pair for _, pair in sorted(entries)] for split, entries in placed.items()}
