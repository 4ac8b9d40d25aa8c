"""The MLflow UI as a user sees it, in a real headless Chromium (Debian's ``chromium``, driven over
the DevTools protocol: ``headless_chromium``), served by ``mlflow server`` on loopback from a store
holding a 2-job sweep, its evaluation and the comparison run: the pages attnseq's URLs open are in
the model-training view, a heatmap image loads, the length-curve chart overlays the two runs, and the
comparison run sits under the sweep parent. Every screenshot is kept in ``test-artifacts/mlflow_ui/``.

Then a newcomer's first hour (issue 24), on ``tiny_run``'s store served by ``make ui``'s own server
(``attnseq.tracking.ui_server``): the link it prints and the run link ``train.py`` printed, opened as
printed, show the training view on their first screen, and the run's last-epoch heatmap is one click
(the run description's link) or three (Artifacts → ``attention`` → ``long.png``) from the run page,
real mouse clicks each. Those screenshots go to ``$ATTNSEQ_SCREENSHOTS`` (else the test's folder)."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import requests
from cli_helpers import (  # noqa: E402  (tests/ is on sys.path under pytest)
    EVALUATE_PY,
    REPO,
    all_runs,
    clean_env,
    explain,
    free_port,
    mlflow_server,
    outputs_under,
    run_cli,
    stop_group,
    tiny,
    tracking_uri,
)
from headless_chromium import HeadlessChromium, chromium_executable
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from attnseq.tracking import paths, tags
from attnseq.tracking.explorer import DATA_ID
from attnseq.tracking.plots import HEATMAP_DPI, HEATMAP_LABEL_PT
from attnseq.tracking.store import UI_HOST, UI_PORT, ui_route, ui_url
from attnseq.tracking.tags import children_of

pytestmark = pytest.mark.slow

SCORERS = ("additive", "dot")
"""Two attending scorers: two curves to overlay, and a sequence both runs attended to."""
ARTIFACTS = REPO / "test-artifacts" / "mlflow_ui"
SERVER_START_S = 180
PAGE_S = 90

FULLSCREEN = 'button[data-component-id="fullscreen_button_chartcard"]'
"""A chart card's full-screen button (MLflow 3.17's component id)."""
CHILD_ROW_EXPANDER = 'button[data-component-id$="runnamecellrenderer.tsx_46"]'
"""The +/- button before a parent run's name in the runs list (MLflow 3.17's component id)."""


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    chromium = chromium_executable()
    assert chromium, "no chromium on PATH: scripts/install-system-deps installs it"
    root = tmp_path_factory.mktemp("mlflow_ui")
    trained = run_cli(root, "-m", f"scorer={','.join(SCORERS)}", *tiny(), *outputs_under(root, seeded=True))
    assert trained.returncode == 0, explain(trained)
    evaluated = run_cli(root, "parent_run_id=latest", "eval.size=60", f"mlflow.tracking_uri={tracking_uri(root)}",
                        f"hydra.run.dir={root}/eval", script=EVALUATE_PY)
    assert evaluated.returncode == 0, explain(evaluated)
    client = MlflowClient(tracking_uri(root))
    runs = {r.info.run_name: r for r in all_runs(client)}
    by_kind = {}
    for run in runs.values():
        by_kind.setdefault(run.data.tags.get("attnseq.kind"), []).append(run)

    with mlflow_server(root, artifacts=False, store=tracking_uri(root)) as server:
        browser = HeadlessChromium(chromium, root / "profile")
        try:
            yield {"root": root, "address": server.url, "browser": browser, "client": client, "runs": runs,
                   "kind": by_kind, "experiment_id": by_kind["train"][0].info.experiment_id}
        finally:
            browser.close()


def screenshot(ui, name: str) -> Path:
    """A screenshot in the test's folder, copied to ``test-artifacts/mlflow_ui/``."""
    path = ui["browser"].screenshot(ui["root"] / name)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / name)
    return path


def page_text(browser) -> str:
    return browser.evaluate("document.body.innerText")


def link_shown(name: str) -> str:
    """JavaScript: is a link with this text on the page?"""
    return f"Array.from(document.querySelectorAll('a')).some(a => a.innerText.trim() === {name!r})"


def card_titled(title: str) -> str:
    """JavaScript: the chart card whose title is ``title``."""
    return f"""(() => {{
        let card = Array.from(document.querySelectorAll('*'))
            .find(e => e.childElementCount === 0 && e.textContent.trim() === {title!r});
        while (card && !card.querySelector({FULLSCREEN!r})) card = card.parentElement;
        return card;
    }})()"""


def open_runs_list(ui, mode: str) -> None:
    """The experiment's runs list (``TABLE`` or ``CHART``) with the sweep's jobs shown under it."""
    browser, [sweep] = ui["browser"], ui["kind"]["sweep"]
    url = ui_url(ui["address"], ui["experiment_id"]).replace("?", "/runs?", 1) + f"&compareRunsMode={mode}"
    browser.goto(url)
    browser.wait_for(link_shown(sweep.info.run_name), PAGE_S, "the sweep parent in the runs list")
    job = ui["kind"]["train"][0].info.run_name
    if not browser.evaluate(link_shown(job)):
        browser.evaluate(f"document.querySelector({CHILD_ROW_EXPANDER!r}).click()")
    browser.wait_for(link_shown(job), PAGE_S, "the sweep's jobs, once the parent is expanded")


def test_the_experiment_url_opens_the_runs_in_the_model_training_view(ui):
    browser, [sweep] = ui["browser"], ui["kind"]["sweep"]
    browser.goto(ui_url(ui["address"], ui["experiment_id"]))
    browser.wait_for(link_shown(sweep.info.run_name), PAGE_S, "the sweep parent in the runs list")
    text = page_text(browser)
    assert "matching runs" in text and "Detect Issues" not in text and "Observability" not in text
    screenshot(ui, "experiment_runs.png")


def test_a_run_page_renders_in_the_model_training_view_and_a_heatmap_loads(ui):
    browser, run = ui["browser"], ui["kind"]["train"][0]
    url = ui_url(ui["address"], ui["experiment_id"], run.info.run_id)
    browser.goto(url)
    browser.wait_for("document.body.innerText.includes('Model metrics')", PAGE_S, "the run page's tabs")
    assert run.info.run_name in page_text(browser) and "Observability" not in page_text(browser)
    browser.goto(url.replace("?", "/model-metrics?", 1))
    loaded = browser.wait_for(
        "Array.from(document.images).filter(i => decodeURIComponent(i.src).includes('attention~') && i.complete"
        " && i.naturalWidth > 0).map(i => i.naturalWidth)", PAGE_S, "a heatmap image, loaded")
    assert all(width > 0 for width in loaded)
    screenshot(ui, "run_model_metrics.png")
    # a card shows MLflow's copy scaled to 256 px; clicking it opens the logged PNG at its own size
    browser.evaluate("Array.from(document.images).find(i => decodeURIComponent(i.src).includes('attention~long')"
                     ").click()")
    full = browser.wait_for(
        "Array.from(document.images).filter(i => /attention~long\\+step\\+0\\+.*[0-9a-f]\\.png/"
        ".test(decodeURIComponent(i.src)) && i.complete).map(i => i.naturalWidth)[0]",
        PAGE_S, "the long heatmap before training, at full size")
    assert full > 256
    screenshot(ui, "run_heatmap_full_size.png")


def test_the_length_curve_chart_overlays_the_two_runs(ui):
    browser = ui["browser"]
    open_runs_list(ui, "CHART")
    browser.evaluate("""(() => {
        const input = document.querySelector('input[placeholder="Search metric charts"]');
        Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(input, 'acc_by_length');
        input.dispatchEvent(new Event('input', {bubbles: true}));
    })()""")
    card = """(() => {
        const title = Array.from(document.querySelectorAll('h4'))
            .find(h => h.textContent.trim() === 'val/acc_by_length');
        if (!title) {  // charts render when scrolled to: bring the val section into view
            const section = Array.from(document.querySelectorAll('*'))
                .find(e => e.childElementCount === 0 && e.textContent.trim() === 'val');
            if (section) section.scrollIntoView({block: 'start'});
            return null;
        }
        let card = title;
        while (card && !card.querySelector('.js-plotly-plot')) card = card.parentElement;
        return card;
    })()"""
    browser.wait_for(f"{card} !== null", PAGE_S, "the val/acc_by_length chart")
    drawn = browser.wait_for(f"""(() => {{
        const card = {card};
        const lines = Array.from(card.querySelectorAll('.scatterlayer .trace'))
            .filter(t => (t.querySelector('path.js-line') || {{getAttribute: () => ''}}).getAttribute('d'));
        return lines.length >= 2 ? card.innerText : null;
    }})()""", PAGE_S, "two drawn curves in the val/acc_by_length chart")
    for run in ui["kind"]["train"]:
        assert f"{run.info.run_name} (val/acc_by_length)" in drawn
    screenshot(ui, "length_curves_overlaid.png")
    browser.evaluate(f"{card_titled('val/acc_by_length')}.querySelector({FULLSCREEN!r}).click()")
    browser.wait_for("Array.from(document.querySelectorAll('[role=dialog] .js-plotly-plot')).length > 0", PAGE_S,
                     "the val/acc_by_length chart, full screen")
    time.sleep(2)  # the full-screen chart draws its lines after the dialog opens
    screenshot(ui, "length_curves_full_screen.png")


def test_the_comparison_run_sits_under_the_sweep_parent(ui):
    browser, [sweep], [comparison] = ui["browser"], ui["kind"]["sweep"], ui["kind"]["comparison"]
    assert comparison.data.tags[MLFLOW_PARENT_RUN_ID] == sweep.info.run_id
    open_runs_list(ui, "TABLE")
    assert browser.evaluate(link_shown(comparison.info.run_name)), "the comparison run is not among the sweep's rows"
    browser.goto(ui_url(ui["address"], ui["experiment_id"], comparison.info.run_id))
    browser.wait_for(f"document.body.innerText.includes('Parent run') && {link_shown(sweep.info.run_name)}",
                     PAGE_S, "the comparison run's page naming its parent")
    screenshot(ui, "comparison_run.png")


def test_the_sweeps_link_opens_the_list_of_its_jobs(ui):
    """The link a sweep prints (its experiment's Runs tab filtered on the parent: ``ui_url``'s
    ``runs_filter``) opens the Runs tab with that filter in its search box, in the model-training view;
    MLflow 3.17 nests the sweep's runs under the parent's row (a nesting no URL query turns off), its
    jobs one click away."""
    browser, [sweep] = ui["browser"], ui["kind"]["sweep"]
    search = children_of(sweep.info.run_id)
    browser.goto(ui_url(ui["address"], ui["experiment_id"], runs_filter=search))
    browser.wait_for(f"Array.from(document.querySelectorAll('input')).some(i => i.value === {search!r})", PAGE_S,
                     "the sweep's filter in the runs search box")
    browser.wait_for(link_shown(sweep.info.run_name), PAGE_S, "the sweep parent's row")
    assert "Observability" not in page_text(browser)
    job = ui["kind"]["train"][0].info.run_name
    if not browser.evaluate(link_shown(job)):
        browser.evaluate(f"document.querySelector({CHILD_ROW_EXPANDER!r}).click()")
    for job in ui["kind"]["train"]:
        browser.wait_for(link_shown(job.info.run_name), PAGE_S, f"the sweep's job {job.info.run_name}")
    screenshot(ui, "sweep_jobs.png")


# -- the links a newcomer is given, opened as printed ------------------------------------------------
SCREENSHOTS_ENV = "ATTNSEQ_SCREENSHOTS"
"""A folder to keep the newcomer-path screenshots in (for a note); by default the test's own folder."""
URL = re.compile(r"https?://[^\s`'\"()]+")
MAX_CLICKS = 3
"""From the run page to the trained heatmap (issue 24)."""
LEGIBLE_PX = 9.0
"""The smallest on-screen height of the heatmap's labels (its tokens, ``HEATMAP_LABEL_PT``) that reads:
the Artifacts tab scales an image to its pane, so a wide heatmap's labels shrink with it."""


def shown(element: str) -> str:
    """JavaScript: is the element the expression finds laid out inside the window (its first screen)?"""
    return f"""(() => {{
        const e = {element};
        if (!e) return false;
        const r = e.getBoundingClientRect();
        return r.width > 0 && r.height > 0 && r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight
            && r.right <= innerWidth;
    }})()"""


def with_text(text: str) -> str:
    """JavaScript: the first element laid out on the page whose own text is exactly ``text``."""
    return f"""(() => {{
        if (!document.body) return null;  // a page still loading
        const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
        for (let node; (node = walk.nextNode());) {{
            if (node.nodeValue.trim() !== {text!r}) continue;
            const r = node.parentElement.getBoundingClientRect();
            if (r.width > 0 && r.height > 0) return node.parentElement;
        }}
        return null;
    }})()"""


def tab(name: str) -> str:
    return f"Array.from(document.querySelectorAll('[role=tab]')).find(t => t.innerText.trim() === {name!r})"


PREVIEWED_IMAGE = """Array.from(document.images).find(i => i.src.startsWith('blob:') && i.complete && i.naturalWidth > 0
    && i.getBoundingClientRect().width > 0)"""
"""The image the Artifacts tab previews (MLflow fetches the file and shows it from a blob URL)."""


@pytest.fixture(scope="module")
def made_ui(tiny_run, tmp_path_factory):
    """``make ui``'s server (``attnseq.tracking.ui_server``, with the Makefile's arguments) on
    ``tiny_run``'s store, the experiment link it printed, and a fresh headless Chromium: a newcomer's
    browser, no UI state saved."""
    chromium = chromium_executable()
    assert chromium, "no chromium on PATH: scripts/install-system-deps installs it"
    root = tmp_path_factory.mktemp("made_ui")
    port = free_port()
    log_path = root / "ui_server.log"
    log = log_path.open("w")  # a file, not a pipe: the server logs every request the pages make
    server = subprocess.Popen(
        [sys.executable, "-m", "attnseq.tracking.ui_server", "--backend-store-uri", tiny_run.uri,
         "--host", "127.0.0.1", "--port", str(port)],
        cwd=root, env=clean_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    browser = None
    experiment_id = tiny_run.runs[0].info.experiment_id
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            links = [u for u in URL.findall(log_path.read_text()) if f"/experiments/{experiment_id}/" in u]
            try:
                if links and requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert server.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"make ui's server did not answer within {SERVER_START_S} s"
            time.sleep(1)
        browser = HeadlessChromium(chromium, root / "profile")
        shots = Path(os.environ.get(SCREENSHOTS_ENV) or root / "screenshots")
        shots.mkdir(parents=True, exist_ok=True)
        yield {"browser": browser, "address": f"127.0.0.1:{port}", "link": links[0], "shots": shots}
    finally:
        if browser is not None:
            browser.close()
        stop_group(server)
        log.close()


def test_the_link_make_ui_prints_opens_the_runs_table_on_its_first_screen(made_ui, tiny_run):
    browser, (run,) = made_ui["browser"], tiny_run.runs
    browser.goto(made_ui["link"])
    name = f"(() => {{ const e = {with_text(run.info.run_name)}; return e && e.closest('a'); }})()"
    browser.wait_for(shown(name), PAGE_S, "the run's name in the runs table, on the first screen")
    text = page_text(browser)
    assert re.search(r"\b1 matching run\b", text), text[:2000]  # the runs table's count: the training view
    assert "Detect Issues" not in text and "Observability" not in text  # nothing of the GenAI view
    browser.screenshot(made_ui["shots"] / "1_make_ui_link_runs_table.png")


def open_the_printed_run_link(made_ui, tiny_run):
    """Open the run link ``train.py`` printed, on the port this test's UI listens on, and wait for
    the run's Overview."""
    browser, (run,) = made_ui["browser"], tiny_run.runs
    [printed] = {u for u in URL.findall(tiny_run.proc.stdout) if f"/runs/{run.info.run_id}" in u}
    parts = urlsplit(printed)
    assert parts.netloc == f"{UI_HOST}:{UI_PORT}", printed  # where `make ui` listens by default
    browser.goto(urlunsplit(parts._replace(netloc=made_ui["address"])))
    browser.wait_for(f"{tab('Overview')} && {tab('Overview')}.getAttribute('aria-selected') === 'true'"
                     f" && {shown(with_text(run.info.run_name))}", PAGE_S, "the run's Overview")
    return run


def assert_the_preview_is_the_last_epochs_heatmap(browser, tiny_run, run, tmp_path) -> None:
    """The image the Artifacts tab previews is the run's last-epoch long heatmap, byte for byte,
    whole and large enough to read."""
    browser.wait_for(f"!!({PREVIEWED_IMAGE})", PAGE_S, "the previewed heatmap, loaded")
    shown_png = base64.b64decode(browser.evaluate(f"""(async () => {{
        const bytes = new Uint8Array(await (await fetch({PREVIEWED_IMAGE}.src)).arrayBuffer());
        let text = '';
        for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
        return btoa(text);
    }})()"""))
    logged = Path(tiny_run.client.download_artifacts(run.info.run_id, paths.heatmap_file("long"), str(tmp_path)))
    assert shown_png == logged.read_bytes(), f"the preview is not {paths.heatmap_file('long')}"
    natural, (left, top, right, width) = browser.evaluate(f"""(() => {{
        const i = {PREVIEWED_IMAGE}, r = i.getBoundingClientRect();
        return [i.naturalWidth, [r.left, r.top, r.right, r.width]];
    }})()""")
    label_px = HEATMAP_LABEL_PT / 72 * HEATMAP_DPI * width / natural  # (a point is 1/72 in)
    assert label_px >= LEGIBLE_PX, f"its labels are {label_px:.1f} px on screen ({natural} px shown in {width:.0f})"
    # its title (the sample, the epoch, the verdict) on the screen, no side cut off
    assert 0 <= left and right <= browser.evaluate("innerWidth"), (left, right)
    assert 0 <= top < browser.evaluate("innerHeight") / 2, top


def test_the_run_link_train_py_prints_opens_the_overview_and_the_trained_heatmap_is_3_clicks_away(
        made_ui, tiny_run, tmp_path):
    browser, shots = made_ui["browser"], made_ui["shots"]
    run = open_the_printed_run_link(made_ui, tiny_run)
    # the first screen: the run's Overview, its description (the note) and its metrics
    first_line = next(line for line in run.data.tags[tags.NOTE].splitlines() if line.strip()).replace("`", "")
    note = f"Array.from(document.querySelectorAll('p')).find(p => p.innerText.trim() === {first_line.strip()!r})"
    browser.wait_for(shown(note), PAGE_S, "the run's description, on the first screen")
    metrics = "Array.from(document.querySelectorAll('h4')).find(h => /^Metrics \\(\\d+\\)$/.test(h.innerText.trim()))"
    assert browser.evaluate(shown(metrics)), "the run's metrics do not start on the first screen"
    assert "Observability" not in page_text(browser)
    browser.screenshot(shots / "2_run_link_overview.png")

    # to the last epoch's long heatmap: Artifacts, its folder, its file
    folder, file = paths.heatmap_file("long").split("/")
    clicks = [(tab("Artifacts"), with_text(folder), "the Artifacts tab"),
              (with_text(folder), with_text(file), f"the {folder}/ folder"),
              (with_text(file), PREVIEWED_IMAGE, file)]
    assert len(clicks) <= MAX_CLICKS
    for step, (target, then, what) in enumerate(clicks, start=3):
        browser.wait_for(shown(target), PAGE_S, f"{what}, to click")
        browser.click(target, what)
        browser.wait_for(f"!!({then})", PAGE_S, f"what clicking {what} shows")
        time.sleep(0.5)  # the preview pane lays the image out once it has loaded
        browser.screenshot(shots / f"{step}_clicked_{re.sub(r'[^a-z]+', '_', what.lower()).strip('_')}.png")
    assert_the_preview_is_the_last_epochs_heatmap(browser, tiny_run, run, tmp_path)


def test_the_run_notes_link_opens_the_trained_heatmap_in_one_click(made_ui, tiny_run, tmp_path):
    """The run's description names each picture as a link (``ui_route``): on the run page's first
    screen, one click opens the heatmap in the Artifacts tab, in a new browser tab (MLflow opens a
    note's links so)."""
    browser = made_ui["browser"]
    run = open_the_printed_run_link(made_ui, tiny_run)
    link = f"(() => {{ const e = {with_text(paths.heatmap_file('long'))}; return e && e.closest('a'); }})()"
    browser.wait_for(shown(link), PAGE_S, "the note's link to the long heatmap, on the first screen")
    this_page = {page["targetId"] for page in browser.pages() if page["attached"]}
    browser.click(link, "the note's link")
    deadline = time.monotonic() + PAGE_S
    while not (opened := [page for page in browser.pages() if page.get("openerId") in this_page]):
        assert time.monotonic() < deadline, ("clicking the note's link opened no tab", browser.pages())
        time.sleep(0.5)
    [new_tab] = opened
    assert f"/runs/{run.info.run_id}/artifacts/{paths.heatmap_file('long')}" in new_tab["url"], new_tab["url"]
    browser.send("Target.closeTarget", targetId=new_tab["targetId"])
    browser.goto(new_tab["url"])  # what that tab shows, in the page this test drives
    assert_the_preview_is_the_last_epochs_heatmap(browser, tiny_run, run, tmp_path)
    browser.screenshot(made_ui["shots"] / "6_note_link_opens_long_heatmap.png")


class ExplorerFrame:
    """The attention explorer as MLflow's artifact view shows it: a sandboxed iframe on a blob URL, in a
    process of its own (attached as a target) or the page's (an isolated world in it): ``evaluate`` runs
    JavaScript there; ``offset()`` is the iframe's top left in the page now, for real mouse events."""

    IFRAME_AT = ("(() => { const f = document.querySelector('iframe.mlflow-html-iframe'); "
                 "if (!f) return null; const r = f.getBoundingClientRect(); "
                 "return r.width > 0 ? [r.left, r.top] : null; })()")

    def __init__(self, browser: HeadlessChromium) -> None:
        self.browser = browser
        browser.wait_for(self.IFRAME_AT, PAGE_S, "the iframe")
        self.session = self.context = None
        deadline = time.monotonic() + PAGE_S
        while self.session is None and self.context is None:
            assert time.monotonic() < deadline, "the explorer's frame did not load"
            frames = [t for t in browser.send("Target.getTargets")["targetInfos"]
                      if t["type"] == "iframe" and t["url"].startswith("blob:")]
            if frames:
                self.session = browser.send("Target.attachToTarget", targetId=frames[0]["targetId"],
                                            flatten=True)["sessionId"]
                browser.send_to(self.session, "Runtime.enable")
                break
            tree = browser.send("Page.getFrameTree")["frameTree"]
            blobs = [f["frame"]["id"] for f in tree.get("childFrames", []) if f["frame"]["url"].startswith("blob:")]
            if blobs:
                self.context = browser.send("Page.createIsolatedWorld", frameId=blobs[0])["executionContextId"]
            time.sleep(0.5)

    @classmethod
    def opened(cls, browser: HeadlessChromium, url: str) -> ExplorerFrame:
        """The explorer at ``url`` in a page loaded afresh: MLflow's app, already showing another artifact
        of the run, keeps that one when only the route changes (an earlier test's ``long.png``)."""
        browser.goto("about:blank")
        browser.wait_for("location.href === 'about:blank'", PAGE_S, "a blank page")
        browser.goto(url)
        return cls(browser)

    def evaluate(self, expression: str):
        params = {"expression": expression, "returnByValue": True}
        if self.session is not None:
            result = self.browser.send_to(self.session, "Runtime.evaluate", **params)
        else:
            result = self.browser.send("Runtime.evaluate", contextId=self.context, **params)
        assert "exceptionDetails" not in result, (expression, result["exceptionDetails"])
        return result["result"].get("value")

    def offset(self) -> tuple[float, float]:
        """Where the iframe is now: MLflow's artifact view may still move it as the rest of the page loads."""
        return self.browser.wait_for(self.IFRAME_AT, PAGE_S, "the iframe")

    def wait_for(self, expression: str, what: str):
        deadline = time.monotonic() + PAGE_S
        while not (value := self.evaluate(expression)):
            assert time.monotonic() < deadline, f"not within {PAGE_S} s: {what}"
            time.sleep(0.5)
        return value


def test_the_attention_explorer_opens_from_the_artifact_view_and_a_hover_shows_the_tooltip(made_ui, tiny_run):
    """``explorer/attention_explorer.html`` in the Artifacts tab (the route the run's note links): drawn in
    MLflow's iframe without errors, a real mouse hover over a cell shows its tokens and weight, and picking
    another sample redraws."""
    browser, (run,) = made_ui["browser"], tiny_run.runs
    browser.send("Runtime.enable")
    frame = ExplorerFrame.opened(
        browser, f"http://{made_ui['address']}/{ui_route(run.info.experiment_id, run.info.run_id, paths.EXPLORER)}")
    frame.wait_for("document.querySelectorAll('[data-panel=attention] rect.cell').length > 0", "the explorer's cells")
    data = frame.evaluate(f"JSON.parse(document.getElementById('{DATA_ID}').textContent)")
    sample = data["epochs"][-1]["samples"][int(frame.evaluate("document.getElementById('sample').value"))]
    deadline = time.monotonic() + PAGE_S
    while not (text := frame.evaluate("(() => { const t = document.getElementById('tooltip'); "
                                      "return t.style.display === 'block' && t.textContent; })()")):
        assert time.monotonic() < deadline, f"not within {PAGE_S} s: the tooltip"
        # the mouse onto the first cell where it is now, again while the page still moves (as a user would)
        left, top = frame.offset()
        x, y = frame.evaluate("(() => { const r = document.querySelector('[data-panel=attention] "
                              "rect.cell[data-row=\"0\"][data-col=\"0\"]').getBoundingClientRect(); "
                              "return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        browser.hover(left + x, top + y)
        time.sleep(0.5)
    weight = sum(head[0][0] for head in sample["attention"]) / len(sample["attention"])
    assert f"“{sample['output'][0]}”" in text and f"“{sample['source'][0]}”" in text and f"{weight:.4f}" in text, text
    time.sleep(0.3)
    browser.screenshot(made_ui["shots"] / "7_attention_explorer_in_the_artifact_view.png")
    before = frame.evaluate("document.getElementById('panels').innerHTML")
    frame.evaluate("(() => { const s = document.getElementById('sample'); s.value = '2'; "
                   "s.dispatchEvent(new Event('change')); })()")
    assert frame.evaluate("document.getElementById('panels').innerHTML") != before
    if frame.session is not None:  # a frame of its own process: its errors, the ones before attaching too
        assert browser.console_errors(frame.session) == []


def test_the_comparison_runs_attention_explorer_opens_in_the_artifact_view(ui):
    """``comparison/attention_explorer.html``: both attending runs, side by side with their difference."""
    browser, [comparison] = ui["browser"], ui["kind"]["comparison"]
    frame = ExplorerFrame.opened(
        browser, f"{ui['address']}/{ui_route(ui['experiment_id'], comparison.info.run_id, paths.COMPARISON_EXPLORER)}")
    frame.wait_for("document.querySelectorAll('[data-panel=difference] rect.cell').length > 0", "the difference map")
    runs = frame.evaluate(f"JSON.parse(document.getElementById('{DATA_ID}').textContent).compare.runs")
    assert sorted(runs) == sorted(run.info.run_name for run in ui["kind"]["train"])
    assert frame.evaluate("[...document.querySelectorAll('.panel')].map(p => p.dataset.panel)") == [
        "run-a", "run-b", "difference"]
    time.sleep(0.3)
    screenshot(ui, "comparison_attention_explorer.png")
    if os.environ.get(SCREENSHOTS_ENV):
        shutil.copy(ui["root"] / "comparison_attention_explorer.png", Path(os.environ[SCREENSHOTS_ENV]))
    if frame.session is not None:
        assert browser.console_errors(frame.session) == []
