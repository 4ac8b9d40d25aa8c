"""Figures people would rather look at than read: attention heatmaps and accuracy vs length."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # headless: figures are rendered to arrays and files, never shown

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import patheffects  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.text import Text  # noqa: E402

GOLD_LABEL = "gold source position"
ARGMAX_LABEL = "attention argmax"


HEATMAP_DPI = 150
"""Pixels per inch of every heatmap: a source or output token gets ``HEATMAP_CELL_IN`` inches (30 px)
and its label is 9 pt, 19 px tall; the margins around a panel are as wide as its labels (``_GridLayout``),
so a full-size heatmap of short tokens is about ``150 × (0.2 × T_src + 1.5)`` px wide (a 12-token
source: 600 px, the narrowest; 30 tokens: 1124 px) and as tall for as many output tokens. MLflow's
image cards show a copy scaled to at most 256 px (``mlflow.tracking.multimedia.compress_image_size``);
the full image opens when a card is clicked. The Artifacts tab fits an image to its preview pane
(about 680 px wide in a 1600-px window, MLflow's assistant panel open): the cell is no larger than
a rotated label needs, so that a 30-token heatmap's labels still read there (10 px; at 48 px a
cell, 7 px)."""
HEATMAP_CELL_IN = 0.2
HEATMAP_LABEL_PT = 9
HEATMAP_MIN_WIDTH_IN = 4.0
"""The narrowest heatmap (600 px): room for the legend on one line and a title in two."""
TITLE_CHAR_PT = 6.0  # a generous mean width of a 10-pt title character: the title wraps at width / this
PANEL_TITLE_CHARS = 28  # a side-by-side panel's title wraps at this width, so neighbours never overlap


def attention_heatmap(
    weights: np.ndarray,
    src_tokens: Sequence[str],
    out_tokens: Sequence[str],
    title: str,
    gold: Sequence[int] | None = None,
    head_labels: Sequence[str] | None = None,
) -> Figure:
    """``weights`` ``(H, T_out, T_src)``: the head mean, then each head when there are several, titled
    by ``head_labels`` (the decoder's ``head_labels``: e.g. ``layer 2 head 0``; ``head h`` by default).

    Source tokens run along the x axis, the decoded tokens down the y axis. Each panel marks its
    own matrix's argmax in every row with a black cross and, when ``gold`` is given (the gold source
    position of each target token, -1 for none), the gold position with a red circle: a cross inside
    a circle is a hit, a cross beside it shows the offset. Sizes: ``HEATMAP_DPI``.
    """
    heads = weights.shape[0]
    panels = [("mean over heads" if heads > 1 else "attention", weights.mean(0))]
    if heads > 1:
        labels = head_labels or [f"head {h}" for h in range(heads)]
        panels += [(labels[h], weights[h]) for h in range(heads)]
    return _heatmap_row([(label, matrix, src_tokens, out_tokens, gold) for label, matrix in panels], title)


def same_sample_heatmaps(
    panels: Sequence[tuple[str, np.ndarray, Sequence[str], Sequence[str]]],
    src_tokens: Sequence[str],
    title: str,
    gold: Sequence[int] | None = None,
) -> Figure:
    """One source sequence as each run attended to it, side by side: ``panels`` holds each run's
    ``(label, weights (H, T_out, T_src), its decoded tokens)``; a panel draws the head mean, marked
    like ``attention_heatmap``."""
    rows = [(label, weights.mean(0), src_tokens, out_tokens, gold) for label, weights, out_tokens in panels]
    return _heatmap_row(rows, title)


def self_attention_heatmaps(
    maps: Mapping[str, Sequence[np.ndarray]],
    src_tokens: Sequence[str],
    out_tokens: Sequence[str],
    title: str,
    start_token: str,
) -> dict[str, Figure]:
    """One sample's self-attention, a figure per stack (``maps``: ``encoder``, ``decoder``, each a list
    of per-layer weights ``(H, T, T)``, as ``Seq2Seq.self_attention(...).of_row`` gives them): a row per
    layer, the head mean then each head when there are several, every row's argmax marked. The
    encoder's queries and keys are the source tokens; the decoder's queries are the output tokens (the
    rows of the cross-attention heatmap) and its keys the inputs each step reads: ``start_token``, then
    every output but the last."""
    figures = {}
    for stack, layers in maps.items():
        keys, queries, ylabel, xlabel = _self_attention_axes(stack, src_tokens, out_tokens, start_token)
        rows = []
        for layer, weights in enumerate(layers, start=1):
            heads = weights.shape[0]
            panels = [(f"layer {layer}, mean over heads" if heads > 1 else f"layer {layer}", weights.mean(0))]
            panels += [(f"layer {layer} head {h}", weights[h]) for h in range(heads)] if heads > 1 else []
            rows.append([(label, matrix, keys, queries, None) for label, matrix in panels])
        figures[stack] = _heatmap_grid(rows, f"{stack} self-attention: {title}", xlabel, ylabel)
    return figures


def same_sample_self_attention(
    stack: str,
    panels: Sequence[tuple[str, Sequence[np.ndarray], Sequence[str]]],
    src_tokens: Sequence[str],
    title: str,
    start_token: str,
    left_out: Sequence[str] = (),
) -> Figure:
    """One source sequence's ``stack`` self-attention as each run computed it, side by side as
    ``same_sample_heatmaps`` draws the cross-attention: a column per run (``panels``: its label, its
    per-layer weights ``(H, T, T)``, its decoded tokens), a row per layer, each the head mean (a run with
    fewer layers leaves its lower cells empty), axes as ``self_attention_heatmaps``'s. The runs in
    ``left_out`` (no self-attention in this stack: an RNN) get no column; the title names them, so that a
    missing run reads as a choice, not a loss."""
    columns = []
    for label, layers, out_tokens in panels:
        keys, queries, ylabel, xlabel = _self_attention_axes(stack, src_tokens, out_tokens, start_token)
        columns.append([(f"{label}: layer {layer}", weights.mean(0), keys, queries, None)
                        for layer, weights in enumerate(layers, start=1)])
    depth = max(len(column) for column in columns)
    rows = [[column[row] if row < len(column) else None for column in columns] for row in range(depth)]
    title = f"{stack} self-attention: {title} (mean over heads)"
    if left_out:
        title += f"; no {stack} self-attention, not drawn: {', '.join(left_out)}"
    return _heatmap_grid(rows, title, xlabel, ylabel)


def _self_attention_axes(stack: str, src_tokens: Sequence[str], out_tokens: Sequence[str], start_token: str):
    """A ``stack``'s self-attention panel's key tokens, query tokens, y and x labels."""
    if stack == "encoder":
        return src_tokens, src_tokens, "source (query)", "source (key)"
    return [start_token, *out_tokens[:-1]], out_tokens, "output (query)", "decoder input (key)"


def _heatmap_row(panels: Sequence[tuple], title: str) -> Figure:
    """Heatmap panels ``(label, matrix (T_out, T_src), src tokens, out tokens, gold or None)`` in a
    row, each sized by its own tokens, one shared colour bar. The figure is at least
    ``HEATMAP_MIN_WIDTH_IN`` wide and its title wraps to its width, so that a short sequence's title,
    verdict and legend are never cut off; ``_GridLayout`` keeps every label inside the figure."""
    return _heatmap_grid([panels], title)


def _heatmap_grid(rows: Sequence[Sequence[tuple]], title: str, xlabel: str = "source",
                  ylabel: str = "output") -> Figure:
    """Rows of heatmap panels as ``_heatmap_row`` draws one, columns sized by the first row's; a None
    panel (below the first row) is an empty cell."""
    longest = max(len(panel[3]) for row in rows for panel in row if panel is not None)
    fig = plt.figure(dpi=HEATMAP_DPI)
    layout = _GridLayout(fig, rows, xlabel, longest)
    axes = [[fig.add_axes((0, 0, 1, 1)) for _ in rows[0]] for _ in rows]  # placed by the layout below
    for row_axes, row in zip(axes, rows):
        for ax, panel in zip(row_axes, row):
            if panel is None:
                ax.set_axis_off()
                continue
            label, matrix, src_tokens, out_tokens, gold = panel
            image = _heatmap_panel(ax, label, matrix, src_tokens, out_tokens, gold, xlabel)
            ax.set_ylim(longest - 0.5, -0.5)  # every panel's rows the same height, the first at the top
        row_axes[0].set_ylabel(ylabel)
    colorbar_axes = fig.colorbar(image, cax=fig.add_axes((0, 0, 1, 1)), label="weight").ax
    handles, labels = axes[0][0].get_legend_handles_labels()
    legend = fig.legend(handles, labels, loc="lower center", ncol=len(handles), fontsize=HEATMAP_LABEL_PT,
                        frameon=False, borderaxespad=0) if handles else None
    width = layout.widen_to(legend)
    title_lines = textwrap.wrap(title, max(1, int(width * 72 / TITLE_CHAR_PT)))
    suptitle = fig.suptitle("\n".join(title_lines), fontsize=HEATMAP_LABEL_PT + 1, va="top")
    layout.place(axes, colorbar_axes, suptitle, legend)
    return fig


def _panel_title(label: str) -> str:
    return "\n".join(textwrap.wrap(label, PANEL_TITLE_CHARS))


class _GridLayout:
    """Where each heatmap panel, the colour bar, the title and the legend go, in inches, from the
    measured extents of the texts around each panel: the y tick labels left of it (and, in the first
    column, the y label), the rotated x tick labels and the x label below, the panel title above.

    Matplotlib's constrained layout finds the same by laying every tick out once more before the
    draw (a third of a heatmap's drawing time, ``benchmarks/results.md``); here each distinct label is
    measured once. A panel's cells are ``HEATMAP_CELL_IN`` square (wider where the panel is widened to
    its title or x label; taller for a one-token panel: ``min_panel_side``), and the figure grows to
    hold its margins, at least ``HEATMAP_MIN_WIDTH_IN`` wide, a wider one holding its panels centred."""

    edge = 0.06  # the figure's blank border, inches
    gap = 0.12  # between a panel and the next one's y labels, a row and the next, the rows and the title or legend
    min_panel_side = 0.8  # inches: a one-token heatmap still shows its cell
    colorbar_pad, colorbar_width = 0.1, 0.15

    def __init__(self, fig: Figure, rows: Sequence[Sequence[tuple]], xlabel: str, longest: int):
        self.fig = fig
        self.measure = measure = _TextMeasure(fig)
        points = 1 / 72
        size = plt.rcParams["font.size"]  # axis labels and colour bar ticks: matplotlib's default size
        tick_room = (plt.rcParams["xtick.major.size"] + plt.rcParams["xtick.major.pad"]) * points
        label_room = measure.height(xlabel, size) + plt.rcParams["axes.labelpad"] * points
        self.left, self.widths = [], []
        for c, column in enumerate(zip(*rows)):
            panels = [panel for panel in column if panel is not None]
            yticks = max(measure.width(token, HEATMAP_LABEL_PT) for panel in panels for token in [*panel[3], ""])
            self.left.append(yticks + tick_room + (label_room if c == 0 else 0.0))
            titles = max(measure.width(_panel_title(panel[0]), HEATMAP_LABEL_PT + 1) for panel in panels)
            cells = HEATMAP_CELL_IN * len(column[0][2])
            self.widths.append(max(cells, self.min_panel_side, titles, measure.width(xlabel, size)))
        self.top, self.bottom = [], []
        for row in rows:
            panels = [panel for panel in row if panel is not None]
            titles = max(measure.height(_panel_title(panel[0]), HEATMAP_LABEL_PT + 1) for panel in panels)
            self.top.append(titles + plt.rcParams["axes.titlepad"] * points)
            xticks = max(measure.width(token, HEATMAP_LABEL_PT) for panel in panels for token in [*panel[2], ""])
            self.bottom.append(xticks + tick_room + label_room)
        self.cell_height = max(HEATMAP_CELL_IN * longest, self.min_panel_side)
        colorbar_ticks = max(measure.width(f"{v:.1f}", size) for v in (0.0, 1.0))
        self.right = self.colorbar_pad + self.colorbar_width + tick_room + colorbar_ticks + label_room
        self.content = sum(self.left) + sum(self.widths) + self.gap * (len(self.widths) - 1) + self.right
        self.width = max(HEATMAP_MIN_WIDTH_IN, self.content + 2 * self.edge)

    def widen_to(self, legend) -> float:
        """The figure's width, widened to hold ``legend`` (None: none) on one line."""
        if legend is not None:
            self.width = max(self.width, self.measure.extent(legend)[0] + 2 * self.edge)
        return self.width

    def place(self, axes, colorbar_axes, suptitle, legend) -> None:
        """Size the figure and put every part in it: the title at the top, the rows of panels below it
        (the colour bar right of them), the legend at the bottom."""
        title_room = self.measure.extent(suptitle)[1] + self.gap
        legend_room = self.measure.extent(legend)[1] + self.gap if legend is not None else 0.0
        rows = len(self.top)
        bottoms, y = [], self.edge + legend_room  # each row's axes' bottom, inches from the figure's bottom
        for r in reversed(range(rows)):
            bottoms.insert(0, y + self.bottom[r])
            y = bottoms[0] + self.cell_height + self.top[r] + (self.gap if r else 0.0)
        width, height = self.width, y + title_room + self.edge
        self.fig.set_size_inches(width, height)
        x0 = (width - self.content) / 2  # (≥ the edge)
        for row_axes, bottom in zip(axes, bottoms):
            for c, ax in enumerate(row_axes):
                x = x0 + sum(self.left[: c + 1]) + sum(self.widths[:c]) + self.gap * c
                ax.set_position((x / width, bottom / height, self.widths[c] / width, self.cell_height / height))
        x = x0 + self.content - self.right + self.colorbar_pad
        span = bottoms[0] + self.cell_height - bottoms[-1]  # the first row's top to the last row's bottom
        colorbar_axes.set_position((x / width, bottoms[-1] / height, self.colorbar_width / width, span / height))
        suptitle.set_y(1 - self.edge / height)
        if legend is not None:
            legend.set_bbox_to_anchor((0.5, self.edge / height), transform=self.fig.transFigure)


class _TextMeasure:
    """Texts' extents in inches as ``fig`` would draw them, each distinct (text, size) measured once."""

    def __init__(self, fig: Figure):
        self.fig = fig
        self.renderer = fig.canvas.get_renderer()
        self.probe = Text(figure=fig)
        self.cache: dict[tuple[str, float], tuple[float, float]] = {}

    def extent(self, artist) -> tuple[float, float]:
        """(width, height) of a drawn artist (a text, a legend)."""
        box = artist.get_window_extent(self.renderer)
        return box.width / self.fig.dpi, box.height / self.fig.dpi

    def size(self, text: str, fontsize: float) -> tuple[float, float]:
        key = (text, fontsize)
        if key not in self.cache:
            self.probe.set_text(text)
            self.probe.set_fontsize(fontsize)
            self.cache[key] = self.extent(self.probe)
        return self.cache[key]

    def width(self, text: str, fontsize: float) -> float:
        return self.size(text, fontsize)[0]

    def height(self, text: str, fontsize: float) -> float:
        return self.size(text, fontsize)[1]


def _heatmap_panel(ax: Axes, label: str, matrix: np.ndarray, src_tokens: Sequence[str],
                   out_tokens: Sequence[str], gold: Sequence[int] | None, xlabel: str = "source"):
    image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(src_tokens)), src_tokens, rotation=90, fontsize=HEATMAP_LABEL_PT)
    ax.set_yticks(range(len(out_tokens)), out_tokens, fontsize=HEATMAP_LABEL_PT)
    ax.set_xlabel(xlabel)
    ax.set_title(_panel_title(label), fontsize=HEATMAP_LABEL_PT + 1)
    if gold is not None:
        points = [(src, out) for out, src in enumerate(gold[: len(out_tokens)]) if src >= 0]
        if points:
            xs, ys = zip(*points)
            ax.scatter(xs, ys, s=70, facecolors="none", edgecolors="red", linewidths=1.3, label=GOLD_LABEL)
    rows = min(len(out_tokens), matrix.shape[0])
    if rows:
        peaks = matrix[:rows].argmax(axis=1)  # (T_out,)
        ax.scatter(peaks, range(rows), s=24, marker="x", c="black", linewidths=1.3, label=ARGMAX_LABEL,
                   path_effects=[patheffects.withStroke(linewidth=2.6, foreground="white")])
    return image


def curve_colours(labels: Sequence[str]) -> dict[str, str]:
    """One colour per curve, in the default colour cycle's order: pass the same mapping to every
    figure of a comparison and a curve keeps its colour in all of them."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}


def accuracy_vs_length(
    curves: Mapping[str, Sequence[Mapping]],
    train_lengths: tuple[int, int] | None,
    title: str,
    metric: str = "acc",
    ylabel: str = "accuracy",
    half_width: str | None = None,
    colours: Mapping[str, str] | None = None,
) -> Figure:
    """One line per curve (``curves``: label → bucket rows with lo, hi and ``metric``), the
    training lengths shaded: the bottleneck curve. ``half_width`` names the rows' key holding the
    half-width of an interval around ``metric``: drawn as a band where present."""
    fig, ax = plt.subplots(figsize=(7, 4))
    _length_panel(ax, curves, train_lengths, metric, half_width, ylabel, colours or curve_colours(list(curves)))
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def metrics_vs_length(
    curves: Mapping[str, Sequence[Mapping]],
    train_lengths: tuple[int, int] | None,
    title: str,
    panels: Sequence[tuple[str, str | None, str]],
    colours: Mapping[str, str] | None = None,
) -> Figure:
    """Panels side by side, one per ``(metric, half_width key or None, y label)``, each drawn like
    ``accuracy_vs_length`` from the same curves and colours, on the metric's own scale."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    colours = colours or curve_colours(list(curves))
    for ax, (metric, half_width, ylabel) in zip(axes[0], panels):
        _length_panel(ax, curves, train_lengths, metric, half_width, ylabel, colours)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _length_panel(
    ax: Axes,
    curves: Mapping[str, Sequence[Mapping]],
    train_lengths: tuple[int, int] | None,
    metric: str,
    half_width: str | None,
    ylabel: str,
    colours: Mapping[str, str],
) -> None:
    banded = False
    for label, rows in curves.items():
        points = [((row["lo"] + row["hi"]) / 2, row[metric], row.get(half_width) if half_width else None)
                  for row in rows if row.get(metric) is not None]
        if not points:
            continue  # nothing to draw: its colour stays reserved by ``colours``
        xs, ys, widths = (np.array(values, dtype=float) for values in zip(*points))  # (P,) each
        ax.plot(xs, ys, marker="o", color=colours[label], label=label)
        has_width = ~np.isnan(widths)  # (P,): no interval (one seed) → no band
        if has_width.any():
            widths = np.nan_to_num(widths)
            ax.fill_between(xs, ys - widths, ys + widths, where=has_width, color=colours[label], alpha=0.2,
                            linewidth=0)
            banded = True
    if train_lengths is not None:
        ax.axvspan(train_lengths[0] - 0.5, train_lengths[1] + 0.5, color="grey", alpha=0.15, label="training lengths")
    handles, labels = ax.get_legend_handles_labels()
    if banded:
        handles.append(Patch(color="black", alpha=0.2, linewidth=0))
        labels.append("band: 95% interval of the mean")
    ax.set_xlabel("source length (bucket centre)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if handles:
        ax.legend(handles, labels, fontsize=8)


def figure_to_array(fig: Figure) -> np.ndarray:
    """Render to an RGB ``uint8`` array ``(H, W, 3)`` and close the figure."""
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()  # (H, W, 3)
    plt.close(fig)
    return image


def write_png(image: np.ndarray, path) -> None:
    """An RGB ``uint8`` array ``(H, W, 3)`` written as a PNG file (as MLflow's ``log_image`` writes one)."""
    from PIL import Image

    Image.fromarray(image).save(path, format="PNG")


def save_figure(fig: Figure, path) -> None:
    """Write a PNG (at 120 pixels per inch, or the figure's own if finer) and close the figure."""
    fig.savefig(path, dpi=max(120, fig.dpi))
    plt.close(fig)
