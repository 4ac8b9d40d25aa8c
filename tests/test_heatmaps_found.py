"""A trained heatmap is found in a minute: every heatmap's title, verdict and legend lie inside its
figure at every sequence length, and no panel's labels run into another panel, the colour bar, the
title or the legend (checked geometrically on the rendered figure), and a training run
holds its last epoch's and best checkpoint's heatmaps as plain artifacts beside its figures, with a
run description (MLflow's note) that says where they are."""

from __future__ import annotations

import re

import numpy as np
import pytest
from cli_helpers import HEATMAP_LABELS, artifact_paths
from matplotlib.text import Text

from attnseq.tracking import paths, tags
from attnseq.tracking.plots import (
    ARGMAX_LABEL,
    GOLD_LABEL,
    HEATMAP_DPI,
    HEATMAP_MIN_WIDTH_IN,
    attention_heatmap,
    same_sample_heatmaps,
    same_sample_self_attention,
    self_attention_heatmaps,
)
from attnseq.tracking.store import ui_route
from attnseq.training.artifacts import heatmap_title

CHECK_DPI = 40
"""The layout is in inches and points, so the check renders at a low resolution: the same geometry,
in a fraction of the time (an 80-token, 4-head heatmap is 20,000 px wide at its own 150)."""


def clipped_texts(figure) -> list[str]:
    """The texts of the rendered ``figure`` whose window extent reaches outside the figure."""
    figure.set_dpi(CHECK_DPI)
    figure.canvas.draw()
    renderer, bounds = figure.canvas.get_renderer(), figure.bbox
    clipped = []
    for text in figure.findobj(Text):
        if not text.get_visible() or not text.get_text():
            continue
        extent = text.get_window_extent(renderer)
        if extent.x0 < bounds.x0 - 0.5 or extent.y0 < bounds.y0 - 0.5 or extent.x1 > bounds.x1 + 0.5 \
                or extent.y1 > bounds.y1 + 0.5:
            clipped.append(text.get_text())
    return clipped


def overlaps(figure) -> list[tuple[str, str]]:
    """The pairs of parts of the rendered ``figure`` whose extents overlap: each axes with its tick
    labels, title and axis labels (the panels, the colour bar), the figure's title and its legend."""
    renderer = figure.canvas.get_renderer()
    parts = [(f"axes {i} ({ax.get_title()!r})", ax.get_tightbbox(renderer)) for i, ax in enumerate(figure.axes)
             if ax.axison]
    parts += [(f"title {text.get_text()!r}", text.get_window_extent(renderer)) for text in figure.texts]  # the suptitle
    parts += [("legend", legend.get_window_extent(renderer)) for legend in figure.legends]

    def overlap(box, other) -> bool:  # by more than half a pixel both ways
        across = min(box.x1, other.x1) - max(box.x0, other.x0)
        return across > 0.5 and min(box.y1, other.y1) - max(box.y0, other.y0) > 0.5

    return [(a, b) for i, (a, box) in enumerate(parts) for b, other in parts[i + 1:] if overlap(box, other)]


@pytest.mark.parametrize(("length", "heads"), [
    *((length, heads) for length in (1, 4, 30, 80) for heads in (1, 4) if (length, heads) != (80, 4)),
    pytest.param(80, 4, marks=pytest.mark.slow),  # 5 panels of 80 × 81 cells: the slowest to draw
])
def test_title_verdict_and_legend_lie_inside_the_heatmap(length, heads):
    weights = np.random.default_rng(length).dirichlet(np.ones(length), size=(heads, length + 1))  # (H, T_out, T_src)
    src = [f"s{i % 10}" for i in range(length)]
    title = heatmap_title("short", length, "epoch 12 (step 12999)", correct=False)
    figure = attention_heatmap(weights, src, [*src, "</s>"], title, gold=[*range(length), -1])
    texts = [text.get_text().replace("\n", " ") for text in figure.findobj(Text)]
    assert title in texts and ARGMAX_LABEL in texts and GOLD_LABEL in texts  # title (with its verdict), legend
    assert clipped_texts(figure) == []
    assert overlaps(figure) == []


@pytest.mark.parametrize("length", [1, 12])
def test_every_label_lies_inside_the_self_attention_figures(length):
    """A row per layer (2 layers, 3 heads: the mean and each head), for the encoder and the decoder."""
    rng = np.random.default_rng(length)
    src, out = [f"s{i % 10}" for i in range(length)], [f"o{i % 10}" for i in range(length)]
    maps = {stack: [rng.dirichlet(np.ones(length), size=(3, length)) for _ in range(2)]  # (H, T, T) per layer
            for stack in ("encoder", "decoder")}
    title = heatmap_title("long", length, "epoch 12 (step 12999)", correct=False)
    for stack, figure in self_attention_heatmaps(maps, src, out, title, "<s>").items():
        assert sum(1 for ax in figure.axes if ax.images) == 2 * 4, stack
        assert clipped_texts(figure) == [], stack
        assert overlaps(figure) == [], stack


def test_runs_side_by_side_keep_their_labels_apart():
    """Two runs' panels of one sample, with word tokens of every width and outputs of different lengths,
    and their self-attention (a run with two layers beside one with one): nothing cut off, nothing
    overlapping."""
    rng = np.random.default_rng(0)
    src = "the international committee agreed yesterday to postpone negotiations".split()
    outputs = [["die", "internationale", "Kommission", "vereinbarte", "</s>"], ["x", "Verhandlungen", "</s>"]]
    panels = [(label, rng.dirichlet(np.ones(len(src)), size=(heads, len(out))), out)  # (H, T_out, T_src)
              for label, heads, out in zip(["run a: gru/additive/bahdanau", "run b: transformer, 4 heads"], [1, 4],
                                           outputs)]
    cross = same_sample_heatmaps(panels, src, "a long comparison title " * 4, gold=list(range(len(src))))
    layers = [("run a", [rng.dirichlet(np.ones(len(src)), size=(2, len(src)))] * 2, outputs[0]),
              ("run b", [rng.dirichlet(np.ones(len(src)), size=(2, len(src)))], outputs[1])]
    encoder = same_sample_self_attention("encoder", layers, src, "title", "<s>", left_out=["an rnn run"])
    for figure in (cross, encoder):
        assert clipped_texts(figure) == []
        assert overlaps(figure) == []


def test_a_trained_run_holds_its_last_and_best_heatmaps_as_plain_files(tiny_run, tmp_path):
    from PIL import Image

    run_id = tiny_run.runs[0].info.run_id
    held = artifact_paths(tiny_run.client, run_id)
    for label in HEATMAP_LABELS:
        assert {paths.heatmap_file(label), paths.best_heatmap_file(label)} <= held, label
    assert paths.LENGTH_FIGURE in held  # beside the heatmaps
    local = tiny_run.client.download_artifacts(run_id, paths.heatmap_file("short"), str(tmp_path))
    with Image.open(local) as image:
        assert image.width >= HEATMAP_MIN_WIDTH_IN * HEATMAP_DPI  # a short source's heatmap is not squeezed


def test_the_run_note_says_what_the_run_is_and_where_each_picture_is(tiny_run):
    run = tiny_run.runs[0]
    note = run.data.tags[tags.NOTE]
    assert len([line for line in note.splitlines() if line.strip()]) == 2
    assert str(run.data.params["model.num_parameters"]) in note.replace(",", "")
    named = [name for name in re.findall(r"\[([^\]]+)\]\(", note) if name.endswith(".png")]
    assert paths.heatmap_file("long") in named and paths.LENGTH_FIGURE in named
    assert set(named) <= artifact_paths(tiny_run.client, run.info.run_id)  # every picture it names is there
    for name in named:  # each a link that opens it in the Artifacts tab, relative to the UI's address
        assert f"[{name}]({ui_route(run.info.experiment_id, run.info.run_id, name)})" in note, name


def test_a_transformers_run_note_links_the_self_attention_of_each_stack_that_has_it():
    """A Transformer's note names one self-attention figure of the first sample as a link, the decoder's
    (the encoder's beside it in the folder: MLflow folds a note longer than about three lines behind *Show
    more*), and no RNN cell for a Transformer encoder; an RNN's note names none."""
    from types import SimpleNamespace

    from model_checks import stand_in_run

    from attnseq.training.artifacts import run_note

    def note(encoder: str, decoder: str) -> str:
        model = stand_in_run("run", encoder=encoder, decoder=decoder).model
        return run_note(SimpleNamespace(task="copy"), SimpleNamespace(model=model, train_lengths=(1, 6)),
                        list(HEATMAP_LABELS), link=lambda path: f"#/{path}")

    for encoder, decoder, stacks in [("transformer", "transformer", ["decoder"]), ("gru", "transformer", ["decoder"]),
                                     ("gru", "bahdanau", [])]:
        text = note(encoder, decoder)
        assert len([line for line in text.splitlines() if line.strip()]) == 2
        linked = [name for name in re.findall(r"\[([^\]]+)\]\(", text) if paths.SELF_ATTENTION_FOLDER in name]
        assert linked == [paths.self_attention_file(stack, HEATMAP_LABELS[0]) for stack in stacks], text
        assert f"[{linked[0]}](#/{linked[0]})" in text if linked else "self_attention" not in text
        assert ("(gru)" in text) == (encoder == "gru"), text


def test_a_trained_run_holds_its_attention_explorer_linked_from_its_note(tiny_run, tmp_path):
    """``explorer/attention_explorer.html``: the heatmap samples at every logged epoch (before training, then
    each epoch), the final model's last, with its importance measures; one click from the run's note."""
    from pathlib import Path

    from cli_helpers import MAX_EPOCHS

    from attnseq.tracking.explorer import explorer_data

    run = tiny_run.runs[0]
    assert paths.EXPLORER in artifact_paths(tiny_run.client, run.info.run_id)
    assert f"[{paths.EXPLORER}]({ui_route(run.info.experiment_id, run.info.run_id, paths.EXPLORER)})" \
        in run.data.tags[tags.NOTE]
    local = Path(tiny_run.client.download_artifacts(run.info.run_id, paths.EXPLORER, str(tmp_path)))
    epochs = explorer_data(local.read_text(encoding="utf-8"))["epochs"]
    assert len(epochs) == 1 + MAX_EPOCHS + 1 and epochs[0]["label"].startswith("before training")
    assert all([s["label"] for s in epoch["samples"]] == list(HEATMAP_LABELS) for epoch in epochs)
    assert all(s["importance"] == {} for epoch in epochs[:-1] for s in epoch["samples"])  # attention alone
    final = epochs[-1]["samples"]
    assert all(set(s["importance"]) == {"grad_x_input", "integrated_gradients", "leave_one_out"} for s in final)
    np.testing.assert_allclose(final[0]["attention"], epochs[-2]["samples"][0]["attention"])  # the last epoch's model
