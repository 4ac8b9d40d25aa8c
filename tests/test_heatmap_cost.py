"""benchmarks/heatmap_cost.py draws the heatmaps a run logs, times them, and sets another checkout's beside."""

from __future__ import annotations

import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS, imported


@pytest.fixture(scope="module")
def heatmap_cost():
    with imported("heatmap_cost") as module:
        yield module


def test_each_figure_is_a_heatmap_of_its_tokens(heatmap_cost):
    from attnseq.tracking import plots

    for figure in heatmap_cost.drawings():
        drawn = figure.draw(plots)
        panels = [ax for ax in drawn.axes if ax.images]
        assert len(panels) == figure.panels, figure.name
        assert all(ax.images[0].get_array().shape[1] == figure.tokens for ax in panels), figure.name
        plots.figure_to_array(drawn)


def test_this_checkout_beside_another_is_timed_alternating_and_tabled(heatmap_cost):
    picked = heatmap_cost.drawings()[:2]
    rows = heatmap_cost.measure(tries=2, against=heatmap_cost.REPO, drawn=picked)
    assert [row.figure for row in rows] == [figure.name for figure in picked]
    assert all(len(row.this) == len(row.against) == 2 and min(row.this + row.against) > 0 for row in rows)
    table = heatmap_cost.render(rows, "python benchmarks/heatmap_cost.py --against x", heatmap_cost.REPO)
    assert all(f"| {row.figure} |" in table for row in rows) and table.count("×") == len(rows)


def test_a_folder_without_plots_is_refused_before_anything_is_drawn(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "heatmap_cost.py"), "--against", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and str(tmp_path) in done.stderr and done.stdout == ""
