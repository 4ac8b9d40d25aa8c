"""The comparison's p-value matrix: groups × groups, one panel per metric."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from attnseq.tracking import plots  # noqa: F401  (first: it selects the headless backend)  # isort: skip

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

P_FLOOR = 1e-4
"""The smallest p the colour scale shows apart (the bootstrap's own floor is 1 / (resamples + 1))."""


def p_value_matrices(names: Sequence[str], panels: Mapping[str, tuple[np.ndarray, np.ndarray]], title: str,
                     alpha: float = 0.05) -> Figure:
    """One panel per metric: above the diagonal the paired bootstrap's p (row group a, column group b),
    below it Welch's over the seeds (mirrored), each cell annotated; a cell with p < ``alpha`` is
    framed and starred, a blank cell has no test. ``panels``: metric → (bootstrap, Welch) ``(G, G)``."""
    g = len(names)
    side = max(2.6, 0.9 * g + 1.2)
    labels_in = 0.07 * max(len(name) for name in names)  # room for the rotated and the row labels
    fig, axes = plt.subplots(1, len(panels), figsize=(side * len(panels) + labels_in + 1.2, side + labels_in + 0.8),
                             squeeze=False, layout="constrained")
    norm = LogNorm(vmin=P_FLOOR, vmax=1.0)
    image = None
    for k, (ax, (metric, (boot, welch))) in enumerate(zip(axes[0], panels.items())):
        shown = np.full((g, g), np.nan)
        upper = np.triu(np.ones((g, g), dtype=bool), 1)
        shown[upper] = boot[upper]
        shown[upper.T] = welch[upper.T]
        image = ax.imshow(np.clip(shown, P_FLOOR, 1.0), cmap="viridis", norm=norm)
        for i in range(g):
            for j in range(g):
                p = shown[i, j]
                if math.isnan(p):
                    continue
                marked = p < alpha
                ax.text(j, i, f"{p:.3g}" + ("*" if marked else ""), ha="center", va="center", fontsize=8,
                        color="white" if p < 0.03 else "black", fontweight="bold" if marked else "normal")
                if marked:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
        ax.set_xticks(range(g), names, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(g), names if k == 0 else [""] * g, fontsize=7)  # the rows: named once
        ax.set_title(f"{metric}\nabove: paired bootstrap; below: Welch", fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=list(axes[0]), shrink=0.8, label="p (log scale)")
    fig.suptitle(f"{title}: p-values, * and red frame: p < {alpha:g}", fontsize=10)
    return fig
