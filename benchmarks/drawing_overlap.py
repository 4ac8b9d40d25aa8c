"""Whether a run's heatmaps could be drawn beside its training steps instead of between them (issue 28, point 2):
the same training steps and the same figures, one after the other, and at once with the figures drawn in a
thread of the training's process or in a process of their own.

    .venv/bin/python benchmarks/drawing_overlap.py                 # 4 rounds of 60 steps and 18 figures
    .venv/bin/python benchmarks/drawing_overlap.py --rounds 6 --steps 80

- **steps**: ``--steps`` training steps of the benchmark's key case (``gru/additive/bahdanau``, copy 5-40, batch
  64, emb 64 / hidden 128, ``--threads`` torch threads) in a minimal loop (``loops.Loop``);
- **figures**: what a ``copy_fast`` run draws in its six heatmap sets (step 0, three epochs, the last and the best
  models' files): three cross-attention heatmaps each (6, 22 and 45 source tokens), ``attention_heatmap`` then
  ``figure_to_array`` as ``RunArtifacts.heatmap_images`` does;
- each round times: the steps alone, the figures alone, the steps then the figures (``one after the other``), the
  figures in a thread while the steps run (``thread``), in a process of their own (``process``, started before the
  rounds, matplotlib imported), and the same with torch on one thread while they draw (``process, 1 torch
  thread``). Medians over the rounds; a ratio below 1 is a saving over one after the other.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

LENGTHS = (6, 22, 45)
SETS = 6


def draw_figures() -> int:
    """The figures of a ``copy_fast`` run's heatmap sets, drawn to pixels; their count."""
    from attnseq.tracking.plots import attention_heatmap, figure_to_array

    rng = np.random.default_rng(0)
    for _, length in itertools.product(range(SETS), LENGTHS):
        src = [f"s{i % 10}" for i in range(length)]
        weights = rng.dirichlet(np.ones(length), size=(1, length + 1))  # (H, T_out, T_src)
        figure_to_array(attention_heatmap(weights, src, [*src, "</s>"], "sample", gold=[*range(length), -1]))
    return SETS * len(LENGTHS)


def training_loop(threads: int):
    import torch
    from cases import KEY_ADDITIVE, Settings, benchmark_config
    from loops import Loop

    from attnseq.config import validate_train
    from attnseq.model import build_seq2seq
    from attnseq.training.build import build_datamodule, model_config
    from attnseq.training.process import keep_freed_memory

    keep_freed_memory()  # as train() does
    torch.set_num_threads(threads)
    settings = Settings(warmup=5, window=25, windows=3, train_size=6400, decode_batches=1, cases=[KEY_ADDITIVE],
                        threads=threads, device="cpu")
    cfg = benchmark_config(KEY_ADDITIVE, settings, Path(tempfile.mkdtemp(prefix="attnseq-overlap-")))
    datamodule = build_datamodule(validate_train(cfg))
    datamodule.setup()
    torch.manual_seed(0)
    model = build_seq2seq(model_config(validate_train(cfg), len(datamodule.src_vocab), len(datamodule.tgt_vocab)))
    return Loop(model, itertools.cycle(list(datamodule.train_dataloader())), cfg, "cpu")


def measure(rounds: int, steps: int, threads: int, log=print) -> dict[str, list[float]]:
    import torch

    loop = training_loop(threads)

    def train() -> None:
        for _ in range(steps):
            loop.step()

    seconds: dict[str, list[float]] = {name: [] for name in (
        "steps alone", "figures alone", "one after the other", "thread", "process", "process, 1 torch thread")}

    def timed(name: str, work) -> None:
        began = time.perf_counter()
        work()
        seconds[name].append(time.perf_counter() - began)

    context = multiprocessing.get_context("forkserver")  # no fork of a process with torch's threads running
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        pool.submit(draw_figures).result()  # the process started and matplotlib imported: what a pool keeps warm
        for _ in range(3):
            loop.step()
        draw_figures()
        for r in range(rounds):
            timed("steps alone", train)
            timed("figures alone", draw_figures)
            timed("one after the other", lambda: (train(), draw_figures()))

            def in_thread() -> None:
                drawing = threading.Thread(target=draw_figures)
                drawing.start()
                train()
                drawing.join()

            timed("thread", in_thread)
            timed("process", lambda: (future := pool.submit(draw_figures), train(), future.result()))
            torch.set_num_threads(1)
            timed("process, 1 torch thread", lambda: (future := pool.submit(draw_figures), train(), future.result()))
            torch.set_num_threads(threads)
            log(f"  round {r + 1}: " + ", ".join(f"{name} {values[-1]:.2f} s" for name, values in seconds.items()))
    return seconds


def render(seconds: dict[str, list[float]], rounds: int, steps: int, threads: int) -> str:
    from attnseq.metrics.significance import welch_p

    base = seconds["one after the other"]
    lines = [
        "| work | seconds (median) | / one after the other | Welch p |",
        "|---|---:|---:|---:|",
    ]
    for name, values in seconds.items():
        compared = name not in ("steps alone", "figures alone", "one after the other")
        ratio = f"{statistics.median(values) / statistics.median(base):.2f}×" if compared else ""
        p = welch_p(values, base) if compared else None
        p = "" if not compared else "–" if p is None else f"{p:.3f}"  # one round: no test
        lines.append(f"| {name} | {statistics.median(values):.2f} | {ratio} | {p} |")
    head = (f"`python benchmarks/drawing_overlap.py --rounds {rounds} --steps {steps} --threads {threads}`: "
            f"{steps} training steps and {SETS * len(LENGTHS)} heatmaps per round, {rounds} rounds.")
    return head + "\n\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the training steps")
    args = parser.parse_args(argv)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    print(render(measure(args.rounds, args.steps, args.threads, log), args.rounds, args.steps, args.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
