"""Figures people would rather look at than read: attention heatmaps and accuracy vs length."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # headless: figures are rendered to arrays and files, never shown

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def attention_heatmap(
    weights: np.ndarray,
    src_tokens: Sequence[str],
    out_tokens: Sequence[str],
    title: str,
    gold: Sequence[int] | None = None,
) -> Figure:
    """``weights`` ``(H, T_out, T_src)``: the head mean, then each head when there are several.

    Source tokens run along the x axis, the decoded tokens down the y axis; ``gold`` (the gold
    source position of each target token, -1 for none) is drawn as red circles.
    """
    heads = weights.shape[0]
    panels = [("mean over heads" if heads > 1 else "attention", weights.mean(0))]
    if heads > 1:
        panels += [(f"head {h}", weights[h]) for h in range(heads)]
    cell = 0.28
    width = max(3.0, cell * len(src_tokens) + 1.5)
    height = max(2.5, cell * len(out_tokens) + 1.3)
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), height), squeeze=False)
    for ax, (label, matrix) in zip(axes[0], panels):
        image = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(len(src_tokens)), src_tokens, rotation=90, fontsize=7)
        ax.set_yticks(range(len(out_tokens)), out_tokens, fontsize=7)
        ax.set_xlabel("source")
        ax.set_title(label, fontsize=8)
        if gold is not None:
            points = [(src, out) for out, src in enumerate(gold[: len(out_tokens)]) if src >= 0]
            if points:
                xs, ys = zip(*points)
                ax.scatter(xs, ys, s=30, facecolors="none", edgecolors="red", linewidths=1.0, label="gold")
    axes[0][0].set_ylabel("output")
    fig.colorbar(image, ax=axes[0][-1], fraction=0.046, pad=0.02, label="weight")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def accuracy_vs_length(
    curves: dict[str, Sequence[dict]],
    train_lengths: tuple[int, int] | None,
    title: str,
    metric: str = "acc",
    ylabel: str = "accuracy",
) -> Figure:
    """One line per run (``curves``: label → bucket rows with lo, hi and ``metric``), the
    training lengths shaded: the bottleneck curve."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rows in curves.items():
        points = [((row["lo"] + row["hi"]) / 2, row[metric]) for row in rows if row.get(metric) is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", label=label)
        else:
            ax.plot([], [])  # no values: keep the colour cycle, so a run has one colour in every figure
    if train_lengths is not None:
        ax.axvspan(train_lengths[0] - 0.5, train_lengths[1] + 0.5, color="grey", alpha=0.15, label="training lengths")
    ax.set_xlabel("source length (bucket centre)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def figure_to_array(fig: Figure) -> np.ndarray:
    """Render to an RGB ``uint8`` array ``(H, W, 3)`` and close the figure."""
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()  # (H, W, 3)
    plt.close(fig)
    return image


def save_figure(fig: Figure, path) -> None:
    """Write a PNG and close the figure."""
    fig.savefig(path, dpi=120)
    plt.close(fig)
