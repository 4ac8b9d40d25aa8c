"""What one attention heatmap costs to draw: each figure a run logs (built by ``attnseq.tracking.plots`` and
rendered to an array, as ``RunArtifacts.heatmap_images`` does at every heatmap validation), timed from its
data to its pixels; with ``--against``, the same figures drawn by another checkout's ``plots.py``,
alternating in one process, with the ratio and Welch's p.

    ../.venv/bin/python heatmap_cost.py                                   # this checkout's figures
    ../.venv/bin/python heatmap_cost.py --against /path/to/other/checkout --tries 7
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PLOTS = Path("attnseq") / "tracking" / "plots.py"


class Drawing(NamedTuple):
    name: str
    tokens: int  # the source's
    panels: int  # heatmaps in the figure
    draw: Callable[[ModuleType], object]  # the plots module → a matplotlib figure


def drawings() -> list[Drawing]:
    """A copy run's three samples (short, medium, longer than its training lengths 5-40), a 4-head model's
    medium one, and a 2-layer, 4-head Transformer's encoder self-attention of the medium one."""
    rng = np.random.default_rng(0)

    def cross(length: int, heads: int) -> Drawing:
        src = [f"s{i % 10}" for i in range(length)]
        weights = rng.dirichlet(np.ones(length), size=(heads, length + 1))  # (H, T_out, T_src)
        title = f"sample of source length {length}, epoch 3 (step 599): wrong"

        def draw(plots: ModuleType):
            return plots.attention_heatmap(weights, src, [*src, "</s>"], title, gold=[*range(length), -1])

        name = f"cross-attention, {length} tokens, {heads} head{'s' if heads > 1 else ''}"
        return Drawing(name, length, 1 + heads if heads > 1 else 1, draw)

    def encoder_self(length: int, layers: int, heads: int) -> Drawing:
        src = [f"s{i % 10}" for i in range(length)]
        maps = {"encoder": [rng.dirichlet(np.ones(length), size=(heads, length)) for _ in range(layers)]}  # (H, T, T)

        def draw(plots: ModuleType):
            return plots.self_attention_heatmaps(maps, src, src, "title", "<s>")["encoder"]

        name = f"encoder self-attention, {length} tokens, {layers} layers × {heads} heads"
        return Drawing(name, length, layers * (1 + heads), draw)

    return [cross(6, 1), cross(22, 1), cross(45, 1), cross(22, 4), encoder_self(22, 2, 4)]


def load_plots(checkout: Path, name: str) -> ModuleType:
    """``checkout``'s ``attnseq/tracking/plots.py`` as a module of its own (it imports no other attnseq module)."""
    spec = importlib.util.spec_from_file_location(name, checkout / PLOTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seconds(plots: ModuleType, figure: Drawing) -> float:
    started = time.perf_counter()
    plots.figure_to_array(figure.draw(plots))
    return time.perf_counter() - started


class Row(NamedTuple):
    figure: str
    this: list[float]
    against: list[float]  # empty without --against

    @property
    def ratio(self) -> float:
        return statistics.median(self.this) / statistics.median(self.against)


def measure(tries: int, against: Path | None = None, drawn: list[Drawing] | None = None,
            log=lambda line: None) -> list[Row]:
    """Each figure (``drawn``, default ``drawings()``) drawn ``tries`` times by this checkout (and, alternating,
    by ``against``), after one untimed draw of each (font caches)."""
    mine = load_plots(REPO, "plots_this")
    theirs = load_plots(against, "plots_against") if against is not None else None
    rows = []
    for figure in drawn or drawings():
        for plots in (mine, theirs):
            if plots is not None:
                seconds(plots, figure)
        this, other = [], []
        for _ in range(tries):
            this.append(seconds(mine, figure))
            if theirs is not None:
                other.append(seconds(theirs, figure))
        rows.append(Row(figure.name, this, other))
        log(f"{figure.name}: {statistics.median(this):.3f} s"
            + (f" vs {statistics.median(other):.3f} s" if other else ""))
    return rows


def render(rows: list[Row], command: str, against: Path | None) -> str:
    from attnseq.metrics.significance import welch_p

    lines = [f"`{command}`: seconds from a figure's data to its pixels (`figure_to_array`), medians over the tries"
             + (", alternating the two checkouts in one process." if against else ".")]
    if against is None:
        lines += ["", "| figure | seconds |", "|---|---:|"]
        lines += [f"| {row.figure} | {statistics.median(row.this):.3f} |" for row in rows]
    else:
        lines += ["", "| figure | this (s) | against (s) | this / against | Welch p |", "|---|---:|---:|---:|---:|"]
        for row in rows:
            p = welch_p(row.this, row.against)
            lines.append(f"| {row.figure} | {statistics.median(row.this):.3f} | {statistics.median(row.against):.3f}"
                         f" | {row.ratio:.2f}× | {'—' if p is None else f'{p:.3f}'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=5, help="timed draws of each figure (default 5)")
    parser.add_argument("--against", type=Path, default=None, help="another checkout whose plots.py to time beside")
    args = parser.parse_args(argv)
    if args.tries < 1:
        parser.error(f"--tries must be at least 1, got {args.tries}")
    if args.against is not None and not (args.against / PLOTS).is_file():
        parser.error(f"--against {args.against}: no {PLOTS} there; pass the root of an attnseq checkout")
    rows = measure(args.tries, args.against, log=lambda line: print(line, file=sys.stderr, flush=True))
    shown = " ".join(argv if argv is not None else sys.argv[1:])
    print(render(rows, f"python benchmarks/heatmap_cost.py {shown}".strip(), args.against))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
