"""The attention explorer in a real headless Chromium (``headless_chromium``), opened from disk (``file://``):
it draws without console errors, a hover shows the tokens and the weight, and switching sample, head and map
redraws. Screenshots go to ``$ATTNSEQ_SCREENSHOTS`` (else the test's folder)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from headless_chromium import HeadlessChromium, chromium_executable
from test_explorer import EXAMPLES, MAX_LENGTH, model_of

from attnseq.faithfulness.explorer import explorer_samples, reference_attention
from attnseq.metrics.faithfulness import ImportanceSettings
from attnseq.tracking.explorer import comparison_explorer_html, explorer_data, explorer_html

pytestmark = pytest.mark.slow

CELL = "document.querySelector('[data-panel={panel}] rect.cell[data-row=\"{row}\"][data-col=\"{col}\"]')"
DRAWING = "document.getElementById('panels').innerHTML"


def pick(browser: HeadlessChromium, select: str, value: str) -> None:
    """Choose ``value`` in the ``<select id=select>`` as its change event tells the page."""
    browser.evaluate(f"(() => {{ const s = document.getElementById('{select}'); s.value = '{value}'; "
                     "s.dispatchEvent(new Event('change')); })()")


def hover_text(browser: HeadlessChromium, row: int, col: int, panel: str = "attention") -> str:
    box = browser.evaluate(f"(() => {{ const r = {CELL.format(row=row, col=col, panel=panel)}.getBoundingClientRect(); "
                           "return [r.left + r.width / 2, r.top + r.height / 2]; })()")
    browser.hover(*box)
    return browser.wait_for("(() => { const t = document.getElementById('tooltip'); "
                            "return t.style.display === 'block' && t.textContent; })()", 20, "the tooltip")


@pytest.fixture(scope="module")
def explorer(tmp_path_factory):
    chromium = chromium_executable()
    assert chromium, "no chromium on PATH: scripts/install-system-deps installs it"
    model, vocab = model_of(scorer="multihead", heads=2, encoder="transformer", decoder="transformer",
                            encoder_options={"layers": 2, "heads": 2, "ff_dim": 16},
                            decoder_options={"layers": 1, "heads": 2, "ff_dim": 16})
    samples = explorer_samples(model, EXAMPLES, vocab, vocab, MAX_LENGTH, ImportanceSettings(ig_steps=8),
                               labels=["short", "medium", "one token"])
    earlier = explorer_samples(model, EXAMPLES, vocab, vocab, MAX_LENGTH, ImportanceSettings(), measures=False)
    root = tmp_path_factory.mktemp("explorer")
    page = root / "attention_explorer.html"
    page.write_text(explorer_html("Attention explorer: a test model", [
        {"label": "epoch 1", "samples": earlier}, {"label": "after 2 epochs (with importance)", "samples": samples}],
        "an untrained Transformer, for the test"), encoding="utf-8")
    forced = [reference_attention(m, EXAMPLES, vocab, vocab) for m in (model, model_of(scorer="dot")[0])]
    compared = root / "comparison_explorer.html"
    compared.write_text(comparison_explorer_html("Attention explorer: 2 runs compared", ["multihead", "dot"], [
        {"label": f"example {k + 1}", "source": e.src, "rows": [*e.tgt, "</s>"], "gold": [*e.alignment, -1],
         "attention": [by_run[k].tolist() for by_run in forced]} for k, e in enumerate(EXAMPLES)]), encoding="utf-8")
    browser = HeadlessChromium(chromium, root / "profile")
    browser.compared = compared
    try:
        browser.send("Runtime.enable")
        browser.send("Log.enable")
        browser.goto(page.as_uri())
        browser.wait_for("document.querySelectorAll('rect.cell').length > 0", 60, "the explorer's cells")
        yield browser, samples
    finally:
        browser.close()


def screenshot(browser: HeadlessChromium, name: str, tmp_path: Path) -> Path:
    folder = Path(os.environ.get("ATTNSEQ_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return browser.screenshot(folder / name)


def test_the_explorer_opens_without_console_errors_and_a_hover_shows_the_tokens_and_the_weight(explorer, tmp_path):
    browser, samples = explorer
    assert browser.console_errors() == []
    assert browser.evaluate("document.getElementById('sample').value") == "1"  # the middle length first
    pick(browser, "sample", "0")
    first = samples[0]
    mean = sum(head[1][2] for head in first["attention"]) / len(first["attention"])
    text = hover_text(browser, 1, 2)
    assert f"“{first['output'][1]}”" in text and f"“{first['source'][2]}”" in text, text
    assert f"{mean:.4f}" in text, text  # the weight: the mean over heads by default
    assert f"{first['importance']['leave_one_out'][1][2]:.4f}" in text, text  # the same step's importance
    screenshot(browser, "explorer_hover.png", tmp_path)
    panels = browser.evaluate("[...document.querySelectorAll('.panel')].map(p => p.dataset.panel)")
    assert panels == ["attention", "grad_x_input", "integrated_gradients", "leave_one_out"]
    marked = browser.evaluate("[document.querySelectorAll('[data-panel=attention] circle.gold').length, "
                              "document.querySelectorAll('[data-panel=attention] text.argmax').length]")
    assert marked[0] == len(first["output"]) - first["gold"].count(-1) and marked[1] >= len(first["output"])
    assert browser.console_errors() == []


def test_switching_sample_head_map_and_epoch_redraws(explorer, tmp_path):
    browser, samples = explorer
    pick(browser, "sample", "0")
    before = browser.evaluate(DRAWING)
    pick(browser, "sample", "1")
    columns = browser.evaluate("document.querySelectorAll('[data-panel=attention] rect.cell[data-row=\"0\"]').length")
    assert browser.evaluate(DRAWING) != before and columns == len(samples[1]["source"])
    mean = browser.evaluate(DRAWING)
    pick(browser, "head", "1")
    assert browser.evaluate(DRAWING) != mean
    assert f"{samples[1]['attention'][1][0][0]:.4f}" in hover_text(browser, 0, 0)
    pick(browser, "map", "encoder:1")  # the encoder's second layer: source × source, no importance beside it
    assert browser.evaluate("[...document.querySelectorAll('.panel')].map(p => p.dataset.panel)") == ["attention"]
    screenshot(browser, "explorer_self_attention.png", tmp_path)
    pick(browser, "map", "cross")
    pick(browser, "epoch", "0")  # an earlier epoch: its attention alone
    assert browser.evaluate("!!document.querySelector('[data-panel=no-importance]')")
    pick(browser, "epoch", "1")
    pick(browser, "sample", "0")
    screenshot(browser, "explorer.png", tmp_path)
    assert browser.console_errors() == []


def test_a_comparison_shows_two_runs_their_difference_and_each_steps_jsd(explorer, tmp_path):
    from scipy.spatial.distance import jensenshannon

    browser, _ = explorer
    browser.goto(browser.compared.as_uri())
    browser.wait_for("document.querySelectorAll('[data-panel=difference] rect.cell').length > 0", 60, "the grids")
    assert browser.evaluate("[...document.querySelectorAll('.panel')].map(p => p.dataset.panel)") == [
        "run-a", "run-b", "difference"]
    pick(browser, "sample", "1")
    sample = explorer_data(browser.compared.read_text(encoding="utf-8"))["compare"]["samples"][1]
    a, b = (np.array(m) for m in sample["attention"])  # (T, T_src) each
    text = hover_text(browser, 2, 3, panel="difference")
    assert f"“{sample['rows'][2]}”" in text and f"“{sample['source'][3]}”" in text, text
    assert f"{a[2, 3] - b[2, 3]:.4f}" in text, text
    jsd = jensenshannon(a[2], b[2]) ** 2  # scipy's is the square root, natural log
    assert f"{jsd:.4f}" in text, text
    shown = browser.evaluate("[...document.querySelectorAll('[data-panel=difference] svg text')].map(t => "
                             "t.textContent)")
    assert f"{jsd:.2f}" in shown  # the step's JSD in the τ-like last column
    screenshot(browser, "comparison_explorer.png", tmp_path)
    pick(browser, "run-b", "0")  # a run against itself: no difference, JSD 0
    assert "difference: 0.0000" in hover_text(browser, 0, 0, panel="difference")
    assert browser.console_errors() == []
