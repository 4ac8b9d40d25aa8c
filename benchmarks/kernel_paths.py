"""The LSTM and biGRU cases with each kernel fast path on and off, in lock step with the textbook
baseline (minimal loops only, no trainer): what ``attnseq.kernels``' LSTM and all-steps additive
paths buy, as ratios measured side by side in one process.

    .venv/bin/python benchmarks/kernel_paths.py            # the cases below, 5 + 3 × 15 steps
    .venv/bin/python benchmarks/kernel_paths.py --steps 8  # a smoke run

Each case trains once per entry of ``PATHS`` in the same lock step with the baseline; ``×base``
is each loop's median window rate over the baseline's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from cases import Case, Settings, benchmark_config
from loops import BASELINE, Loop, TextbookBahdanau, step_together, window_rates

from attnseq.kernels import ALL_FAST_PATHS, FastPaths
from attnseq.model import build_seq2seq
from attnseq.training.build import build_datamodule, model_config
from attnseq.training.process import keep_freed_memory

KERNEL_CASES = [
    Case("lstm", "additive", "bahdanau"),
    Case("lstm", "concat", "bahdanau"),
    Case("lstm", "additive", "luong"),
    Case("lstm", "concat", "luong"),
    Case("lstm", "dot", "luong-nofeed"),
    Case("bigru", "additive", "luong"),
    Case("bigru", "additive", "luong-nofeed"),
    Case("bigru", "concat", "luong-nofeed"),
]
"""The cases issue 16 names (LSTM; biGRU with an additive/concat score under Luong)."""

PATHS = {
    "now": ALL_FAST_PATHS,
    "before": FastPaths(lstm_sequence=False),
    "additive kernel": FastPaths(additive_all_steps=True),
}
"""The loops of each case: the defaults; without the LSTM kernel (the model before it); with the
all-steps additive kernel, which is off by default."""


def measure(cases: list[Case], warmup: int, window: int, windows: int, threads: int, log=print) -> dict:
    """``{case name: {PATHS key: ×base}}``, each case in its own lock step with a baseline."""
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")
    keep_freed_memory()
    steps = warmup + window * windows + 1
    settings = Settings(warmup, window, windows, 64 * (steps + 2), 1, cases, threads, "cpu")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="attnseq-kernels-") as workdir:
        for case in cases:
            cfg = benchmark_config(case, settings, Path(workdir))
            datamodule = build_datamodule(cfg)
            datamodule.setup()
            tokens = [int(b.tgt_lengths.sum()) for b in datamodule.train_dataloader()]
            vocab = (len(datamodule.src_vocab), len(datamodule.tgt_vocab))
            loops = {}
            for label, paths in PATHS.items():
                torch.manual_seed(0)
                loops[label] = Loop(
                    build_seq2seq(model_config(cfg, *vocab), paths), datamodule.train_dataloader(), cfg, "cpu"
                )
            torch.manual_seed(0)
            loops[BASELINE] = Loop(TextbookBahdanau(*vocab, *settings.sizes), datamodule.train_dataloader(), cfg, "cpu")
            step_together(list(loops.values()), steps - 1)
            rates = {
                label: statistics.median(window_rates(loop.durations, tokens, warmup, window, windows))
                for label, loop in loops.items()
            }
            results[case.name] = {label: rates[label] / rates[BASELINE] for label in PATHS}
            log(f"{case.name:32s} " + "  ".join(f"{k} {v:.2f}×" for k, v in results[case.name].items()))
    return results


def render(results: dict, command: str) -> str:
    lines = [
        "## LSTM and biGRU kernels (minimal loops, ×base in one lock step)",
        "",
        f"`{command}`; `before`: the LSTM kernel off; `additive kernel`: `FastPaths(additive_all_steps=True)`.",
        "",
        "| encoder / scorer / decoder | before ×base | now ×base | speed-up | additive kernel ×base |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, ratios in results.items():
        before, now, kernel = ratios["before"], ratios["now"], ratios["additive kernel"]
        lines.append(f"| {name} | {before:.2f}× | {now:.2f}× | {now / before:.2f}× | {kernel:.2f}× |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--window", type=int, default=15)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cases", nargs="*", default=None, help="case names, e.g. lstm/additive/bahdanau")
    args = parser.parse_args(argv)
    cases = [c for c in KERNEL_CASES if args.cases is None or c.name in args.cases]
    results = measure(
        cases,
        args.warmup,
        args.window,
        args.windows,
        args.threads,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(render(results, "python benchmarks/kernel_paths.py " + " ".join(argv if argv is not None else sys.argv[1:])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
