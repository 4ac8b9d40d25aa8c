"""The front page and the write-ups hold together: the README stays a front page (at most 250 lines),
every relative link and image in it, in ``docs/`` and in ``benchmarks/README.md`` opens a file (and
every ``#anchor`` a heading of it), every long page has a table of contents, and the README's config
table lists exactly the options in ``conf/`` (the default first) and the registered choices. Reads
files and the torch-free registries only: no training."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]
FRONT_PAGE_LINES = 250
LONG_PAGE_LINES = 120
"""A page longer than this has a table of contents: a link to each of its ``##`` sections."""

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_SOURCE = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.I)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(path: Path) -> list[str]:
    """The page's lines outside fenced code blocks, inline code blanked (so a ``#`` comment in a shell
    block is not a heading, and ``x[0](y)`` in code is not a link)."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        lines.append("" if fenced else line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors as its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The ``#anchor`` of every heading of a page (a repeated heading gets ``-1``, ``-2``, … as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path):
        match = _HEADING.match(line)
        if match:
            base = slug(match.group(2))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return frozenset(found)


def relative_links(path: Path) -> list[str]:
    """Every link and image target of a page that is not a web address."""
    targets = []
    for line in prose_lines(path):
        line = re.sub(r"`[^`]*`", "``", line)
        targets += _LINK.findall(line) + _HTML_SOURCE.findall(line)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]  # http:, https:, mailto:


def broken(path: Path, target: str) -> str | None:
    """Why ``target``, linked from ``path``, does not open, or None if it does."""
    file, _, anchor = target.partition("#")
    goal = (path.parent / file).resolve() if file else path
    if not goal.exists():
        return f"{target}: no file {goal.relative_to(REPO) if goal.is_relative_to(REPO) else goal}"
    if anchor and goal.suffix == ".md" and anchor not in anchors(goal):
        return f"{target}: no heading #{anchor} in {goal.relative_to(REPO)} (its anchors: {sorted(anchors(goal))})"
    return None


def test_the_readme_is_a_front_page():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= FRONT_PAGE_LINES, (f"README.md has {lines} lines, over {FRONT_PAGE_LINES}: move a section into "
                                       "docs/ and link it from 'Where to read on'.")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_image_opens(page):
    links = relative_links(page)
    assert links or page != README  # the front page links its write-ups
    problems = [why for why in (broken(page, target) for target in links) if why]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_a_long_page_has_a_table_of_contents(page):
    lines = prose_lines(page)
    if len(lines) <= LONG_PAGE_LINES:
        return
    sections = [slug(m.group(2)) for m in map(_HEADING.match, lines) if m and m.group(1) == "##"]
    linked = {target[1:] for target in relative_links(page) if target.startswith("#")}
    assert sections and not set(sections) - linked, (
        f"{page.relative_to(REPO)} has {len(lines)} lines and no contents link to: {sorted(set(sections) - linked)}")


def test_the_slug_is_githubs():
    """Anchors as GitHub writes them, for the kinds of heading these pages have."""
    assert slug("Is the attention an explanation? (Jain & Wallace, 2019)") == \
        "is-the-attention-an-explanation-jain--wallace-2019"
    assert slug("Using a trained model: MLflow's `predict`, `serve` and registry") == \
        "using-a-trained-model-mlflows-predict-serve-and-registry"
    assert slug("Real text: English → French messages") == "real-text-english--french-messages"
    assert slug("`hparams_search` and ctrl-C") == "hparams_search-and-ctrl-c"


# ---- the config table ---------------------------------------------------------------------------

CONF = REPO / "conf"
GROUPS = sorted(d.name for d in CONF.iterdir() if d.is_dir() and d.name != "hydra")
"""Every config group a user picks an option of (``hydra/`` holds Hydra's own: the launchers)."""


def config_table() -> dict[str, list[str]]:
    """The README's config table: each group's options in the order written (``| `scorer=` | `dot`, … |``).
    An option is a backticked name opening the cell or after ``, ``; a note in brackets is not one."""
    rows = {}
    for line in prose_lines(README):
        match = re.match(r"\| `([\w/]+)=` \| (.*) \|\s*$", line)
        if match:
            rows[match.group(1)] = re.findall(r"(?:^|, )`([\w-]+)`", match.group(2))
    return rows


def options_in_conf(group: str) -> set[str]:
    return {path.stem for path in (CONF / group).glob("*.yaml")}  # base/ folders hold shared parts


def default_option(group: str) -> str | None:
    for entry in yaml.safe_load((CONF / "train.yaml").read_text())["defaults"]:
        if isinstance(entry, dict) and group in entry:
            return entry[group]
    return None


@pytest.mark.parametrize("group", GROUPS)
def test_the_config_table_lists_every_option_of_each_group_default_first(group):
    table = config_table()
    assert group in table, f"README.md's config table has no row | `{group}=` | for conf/{group}/"
    options = table[group]
    assert len(options) == len(set(options)), options
    assert set(options) == options_in_conf(group), (group, options, sorted(options_in_conf(group)))
    if default_option(group) is not None:
        assert options[0] == default_option(group), f"{group}: the default (conf/train.yaml) is {default_option(group)}"


def test_the_config_table_has_no_row_without_a_group():
    assert set(config_table()) <= set(GROUPS)


def test_the_config_table_lists_exactly_the_registered_choices():
    """Each registry's own choices (a test may register plugin choices in this process) are the table's."""
    from attnseq.attention.settings import ScorerSettings
    from attnseq.data.tasks import TASKS
    from attnseq.model.conventions import DECODER_CONVENTIONS
    from attnseq.model.encoders import ENCODER_KINDS

    def own(registry) -> set[str]:
        return {name for name, cls in registry.items() if cls.__module__.startswith("attnseq.")}

    table = config_table()
    for group, registry in (("scorer", ScorerSettings.registry), ("decoder", DECODER_CONVENTIONS),
                            ("dataset", TASKS)):
        assert set(table[group]) == own(registry), (group, table[group], sorted(own(registry)))
    # an encoder option names its kind (``kind:``, else the registry's default): every kind is offered
    kinds = {yaml.safe_load((CONF / "encoder" / f"{name}.yaml").read_text()).get("kind", ENCODER_KINDS.default)
             for name in table["encoder"]}
    assert kinds == own(ENCODER_KINDS), (kinds, sorted(own(ENCODER_KINDS)))
