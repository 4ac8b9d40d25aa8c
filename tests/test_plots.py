"""The attention heatmap marks the gold source position and each panel's own argmax differently,
so a one-position shift shows: checked on hand-built matrices whose argmax is known."""

from __future__ import annotations

import numpy as np
from matplotlib.collections import PathCollection

from attnseq.tracking.plots import ARGMAX_LABEL, GOLD_LABEL, attention_heatmap

SRC = ["a", "b", "c", "d"]
OUT = ["A", "B", "C"]


def shifted_by_one() -> np.ndarray:
    """(T_out=3, T_src=4): output step t puts 0.7 on source t + 1, the rest spread evenly."""
    matrix = np.full((3, 4), 0.1)
    for step in range(3):
        matrix[step, step + 1] = 0.7
    return matrix


def markers(ax, label: str) -> list[tuple[int, int]]:
    [points] = [c for c in ax.collections if isinstance(c, PathCollection) and c.get_label() == label]
    return [tuple(int(v) for v in xy) for xy in points.get_offsets()]


def test_gold_and_argmax_are_drawn_apart_when_attention_is_off_by_one():
    weights = shifted_by_one()[None]  # (H=1, T_out, T_src)
    figure = attention_heatmap(weights, SRC, OUT, "shift", gold=[0, 1, 2])
    ax = figure.axes[0]
    assert markers(ax, GOLD_LABEL) == [(0, 0), (1, 1), (2, 2)]  # (source, output)
    assert markers(ax, ARGMAX_LABEL) == [(1, 0), (2, 1), (3, 2)]  # one to the right of gold
    [legend] = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == [GOLD_LABEL, ARGMAX_LABEL]


def test_each_panel_marks_its_own_argmax_and_unaligned_steps_have_no_gold():
    first = shifted_by_one()
    second = np.full((3, 4), 0.05)
    second[:, 0] = 0.85  # head 1 looks at the first source token throughout
    weights = np.stack([first, second])  # (H=2, T_out, T_src)
    figure = attention_heatmap(weights, SRC, OUT, "two heads", gold=[0, -1, 2])
    mean_ax, head0, head1 = figure.axes[:3]
    # the head mean puts 0.475 on source 0 at every step, 0.375 on step + 1
    assert markers(mean_ax, ARGMAX_LABEL) == [(0, 0), (0, 1), (0, 2)]
    assert markers(head0, ARGMAX_LABEL) == [(1, 0), (2, 1), (3, 2)]
    assert markers(head1, ARGMAX_LABEL) == [(0, 0), (0, 1), (0, 2)]
    assert markers(head1, GOLD_LABEL) == [(0, 0), (2, 2)]  # step 1 has no gold position


def test_without_gold_only_the_argmax_is_marked():
    figure = attention_heatmap(shifted_by_one()[None], SRC, OUT, "no gold")
    ax = figure.axes[0]
    assert markers(ax, ARGMAX_LABEL) == [(1, 0), (2, 1), (3, 2)]
    assert not [c for c in ax.collections if c.get_label() == GOLD_LABEL]
