"""The additive kernels' large buffers in blocks of steps (``attnseq.kernels.buffers``) against one buffer of every
step, as the kernels allocated them before: the block size, then whole training steps.

    .venv/bin/python benchmarks/kernel_blocks.py                       # both tables, 5 rounds
    .venv/bin/python benchmarks/kernel_blocks.py --steps 0             # the kernel's table only (≈ 1 min)
    .venv/bin/python benchmarks/kernel_blocks.py --case bigru/additive/luong --case lstm/additive/transformer

**The all-steps score** (``kernels.additive_scores``, forward and backward): batch 64, one or two heads, T_dec × T_enc
steps, ``a`` wide (128: the attention of a 128-wide decoder; 256: a biGRU's keys). Each round runs every block size
once, in turn; ``one block`` is every step in one chunk (the kernel before, whose chunk limit was 256 MiB). Past
glibc's mmap threshold (32 MiB at most) a buffer is fresh pages on every call, faulted in by the first write.

**Whole training steps**: for each case, two copies of its model (the same weights) train in lock step on the same
bucketed batches of the benchmark's copy task (lengths 5–40, emb 64 / hidden 128, batch 64, the minimal loop of
``bench.py``), one with ``BLOCK_BYTES`` as it is and one with one block of every step (σ of the recurrences and the
chunks of the all-steps score); the medians of the windows' tokens/s and their ratio, and each copy's minor page
faults per step (a page the allocator handed out fresh, faulted in by its first write). The allocator keeps freed
memory, as ``train()`` has it.
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench import case_named, setup_datamodule
from cases import Case, Settings, benchmark_config
from loops import Loop

from attnseq.config import validate_train
from attnseq.kernels import buffers
from attnseq.kernels.additive_scores import additive_scores
from attnseq.model import build_seq2seq
from attnseq.training.build import model_config
from attnseq.training.process import keep_freed_memory

SHAPES = ((1, 23, 22, 128), (1, 41, 40, 128), (1, 23, 22, 256), (1, 41, 40, 256), (2, 23, 22, 128))
"""(heads, T_dec, T_enc, a) per row of the kernel's table; batch ``BATCH``."""
BATCH = 64
MIB = 2**20
BLOCKS = (2 * MIB, 4 * MIB, 6 * MIB, 8 * MIB, 16 * MIB)
ONE_BLOCK = 256 * MIB
"""The chunk limit before blocks: at the benchmark's sizes, every step in one chunk (and all σ in one buffer)."""
CASES = ("bigru/additive/luong-nofeed", "bigru/concat/luong-nofeed", "bigru/additive/luong", "bigru/additive/bahdanau",
         "lstm/additive/transformer", "gru/additive/bahdanau")


def with_blocks(block_bytes: int):
    """Set ``buffers.BLOCK_BYTES`` (the kernels read it at every call)."""
    buffers.BLOCK_BYTES = block_bytes


def score_pass(heads: int, t_dec: int, t_enc: int, a: int, seed: int = 0):
    """A function running the all-steps score forward and backward on fixed random inputs."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(BATCH, 1, t_dec, a, generator=generator).requires_grad_()  # (B, 1, T_dec, a)
    keys = torch.randn(BATCH, heads, t_enc, a, generator=generator).requires_grad_()  # (B, H, T_enc, a)
    v = torch.randn(heads, a, generator=generator).requires_grad_()  # (H, a)
    upstream = torch.randn(BATCH, heads, t_dec, t_enc, generator=generator)  # (B, H, T_dec, T_enc)

    def run() -> None:
        additive_scores(query, keys, v).backward(upstream)

    return run


def measure_kernel(rounds: int, repeats: int, shapes=SHAPES, blocks=BLOCKS) -> list[dict]:
    sizes = (ONE_BLOCK, *blocks)
    rows = []
    default = buffers.BLOCK_BYTES
    try:
        for shape in shapes:
            run = score_pass(*shape)
            seconds: dict[int, list[float]] = {size: [] for size in sizes}
            for size in sizes:  # warm-up: each size's buffers once
                with_blocks(size)
                run()
            for _ in range(rounds):
                for size in sizes:
                    with_blocks(size)
                    began = time.perf_counter()
                    for _ in range(repeats):
                        run()
                    seconds[size].append((time.perf_counter() - began) / repeats)
            rows.append({"shape": shape, **{size: statistics.median(values) for size, values in seconds.items()}})
    finally:
        with_blocks(default)
    return rows


def measure_steps(cases: list[Case], steps: int, windows: int, workdir: Path) -> list[dict]:
    """Each case's two copies in lock step: tokens/s with the default blocks and with one block."""

    default = buffers.BLOCK_BYTES
    warmup = 3
    settings = Settings(warmup=warmup, window=steps, windows=windows, train_size=64 * (warmup + steps * windows + 1),
                        decode_batches=1, cases=[], threads=torch.get_num_threads(), device="cpu")
    rows = []
    for case in cases:
        name = case.name
        cfg = benchmark_config(case, settings, workdir)
        datamodule = setup_datamodule(cfg)
        batches = list(datamodule.train_dataloader())
        vocab = (len(datamodule.src_vocab), len(datamodule.tgt_vocab))
        loops = {}
        for way in ("blocks", "one block"):
            torch.manual_seed(0)
            loops[way] = Loop(build_seq2seq(model_config(validate_train(cfg), *vocab)), batches, cfg, "cpu")
        sizes = {"blocks": default, "one block": ONE_BLOCK}
        faults = {way: 0 for way in loops}  # minor page faults in the timed windows
        try:
            for step in range(warmup + steps * windows):
                for way, loop in loops.items():
                    with_blocks(sizes[way])
                    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    loop.step()
                    if step >= warmup:
                        faults[way] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        finally:
            with_blocks(default)
        last = float(loops["blocks"].losses[-1]), float(loops["one block"].losses[-1])
        if not math.isclose(*last, rel_tol=1e-3):  # chunks sum in another order: float rounding, nothing more
            raise RuntimeError(f"{name}: the two copies trained apart (last loss {last[0]} against {last[1]})")
        rates = {way: [] for way in loops}
        for window in range(windows):
            span = slice(warmup + window * steps, warmup + (window + 1) * steps)
            for way, loop in loops.items():
                rates[way].append(sum(loop.tokens[span]) / sum(loop.durations[span]))
        rows.append({"case": name, **{way: statistics.median(values) for way, values in rates.items()},
                     "ratios": [b / o for b, o in zip(rates["blocks"], rates["one block"], strict=True)],
                     "faults": {way: count / (steps * windows) for way, count in faults.items()}})
        print(f"  {name}: {rows[-1]['blocks']:,.0f} against {rows[-1]['one block']:,.0f} tokens/s", file=sys.stderr,
              flush=True)
    return rows


def render_kernel(rows: list[dict], command: str, threads: int) -> str:
    sizes = [size for size in rows[0] if size != "shape"]
    default = buffers.BLOCK_BYTES
    header = " | ".join("one block" if size == ONE_BLOCK else f"{size // MIB} MiB" for size in sizes)
    lines = ["## Kernel buffers in blocks", "",
             f"`{command}`; {threads} torch threads; `BLOCK_BYTES` {default // MIB} MiB.", "",
             "The all-steps additive score, forward + backward, batch 64: ms (medians over rounds), and one block's "
             "time over the default's.", "",
             f"| heads | T_dec × T_enc | a | {header} | one block / {default // MIB} MiB |",
             "|---:|---:|---:|" + "---:|" * len(sizes) + "---:|"]
    for row in rows:
        heads, t_dec, t_enc, a = row["shape"]
        cells = " | ".join(f"{1e3 * row[size]:.1f}" for size in sizes)
        ratio = row[ONE_BLOCK] / row[default] if default in row else float("nan")
        lines.append(f"| {heads} | {t_dec} × {t_enc} | {a} | {cells} | {ratio:.2f}× |")
    return "\n".join(lines) + "\n"


def render_steps(rows: list[dict]) -> str:
    lines = ["Whole training steps in lock step (minimal loop, bucketed batches): tokens/s, medians of the windows; "
             "blocks / one block per window; the minor page faults per timed step of each copy (4 KiB each).", "",
             "| case | blocks | one block | blocks / one block | per window | faults per step, blocks / one block |",
             "|---|---:|---:|---:|---|---:|"]
    for row in rows:
        windows = ", ".join(f"{ratio:.2f}" for ratio in row["ratios"])
        lines.append(f"| {row['case']} | {row['blocks']:,.0f} | {row['one block']:,.0f} | "
                     f"{statistics.median(row['ratios']):.2f}× | {windows} | "
                     f"{row['faults']['blocks']:,.0f} / {row['faults']['one block']:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="kernel: rounds, every block size once per round")
    parser.add_argument("--repeats", type=int, default=2, help="kernel: passes per block size and round")
    parser.add_argument("--steps", type=int, default=20, help="training steps per window (0: no training table)")
    parser.add_argument("--windows", type=int, default=3, help="timed windows per case")
    parser.add_argument("--case", action="append", type=case_named,
                        help=f"encoder/scorer/decoder (repeatable; default: {', '.join(CASES)})")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args(argv)
    if min(args.rounds, args.repeats, args.windows, args.threads) < 1 or args.steps < 0:
        parser.error("--rounds, --repeats, --windows and --threads must be at least 1, --steps at least 0")
    cases = args.case or [case_named(name) for name in CASES]
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as train() does: below the mmap threshold, freed buffers are reused
    command = "python benchmarks/kernel_blocks.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(render_kernel(measure_kernel(args.rounds, args.repeats), command.strip(), args.threads), flush=True)
    if args.steps:
        with tempfile.TemporaryDirectory() as workdir:
            print(render_steps(measure_steps(cases, args.steps, args.windows, Path(workdir))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
