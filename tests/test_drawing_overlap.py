"""benchmarks/drawing_overlap.py times a run's heatmaps drawn after its training steps and beside them."""

from __future__ import annotations

import re
import subprocess
import sys

from benchmark_scripts import BENCHMARKS, imported

from attnseq.tracking import plots


def test_the_figures_are_a_copy_fast_runs_heatmap_sets(monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "figure_to_array", lambda figure: drawn.append(figure) or figure)
    with imported("drawing_overlap") as module:
        assert module.draw_figures() == len(drawn) == module.SETS * len(module.LENGTHS)
    tokens = [figure.axes[0].images[0].get_array().shape[1] for figure in drawn]
    assert sorted(set(tokens)) == [6, 22, 45]


def test_every_way_is_timed_and_set_beside_drawing_after_the_steps():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "drawing_overlap.py"), "--rounds", "1", "--steps", "2",
                           "--threads", "1"], capture_output=True, text=True, timeout=600, cwd=BENCHMARKS)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {match[0]: match[1] for match in re.findall(r"^\| ([a-z ,0-9]+) \| ([0-9.]+) \|", done.stdout, re.M)}
    assert list(rows) == ["steps alone", "figures alone", "one after the other", "thread", "process",
                          "process, 1 torch thread"]
    assert all(float(seconds) > 0 for seconds in rows.values())
    assert done.stdout.count("×") == 3  # the three ways beside the steps, each over one after the other
