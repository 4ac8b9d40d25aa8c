"""The optimizer's fused step (``attnseq.training.optimizers``) against PyTorch's default step, side by side:
two copies of one model from the same weights train on the same batches, alternating batch by batch (which
goes first alternates too), each batch timed from its forward to, every ``trainer.accumulate_grad_batches``
batches, the gradient clipping and the optimizer's step, as ``train()`` steps. Medians and means of the ms per
batch after a warm-up, and the clipping and step's own share.

    .venv/bin/python benchmarks/optimizer_step.py        # copy, lengths 5-40, batch 64, emb 64 / hidden 128
    .venv/bin/python benchmarks/optimizer_step.py experiment=joey_reverse dataset.train_size=6000
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loops import loss_fn  # noqa: E402  (its sibling, as a script sees it)

from attnseq.cli import compose_command_line  # noqa: E402
from attnseq.config import validate_train  # noqa: E402
from attnseq.model import build_seq2seq  # noqa: E402
from attnseq.training.build import build_datamodule, model_config, optimizer_factory  # noqa: E402

BENCHMARK_SIZES = ("dataset.train_lengths=[5,40]", "dataset.eval_lengths=[5,40]", "dataset.train_size=12800",
                   "model.embedding_dim=64", "model.hidden_size=128")
SIDES = {"fused": (), "default": ("+optimizer.fused=false",)}


def measure(overrides: list[str], batches: int, warmup: int, threads: int, workdir: Path) -> dict[str, dict]:
    """Per side: ``ms`` (each timed batch), ``step_ms`` (its clipping and optimizer step, 0 between steps) and
    ``fused`` (whether its optimizer took the fused step)."""
    torch.set_num_threads(threads)
    outputs = [f"paths.output_dir={workdir}/out", f"mlflow.tracking_uri=sqlite:///{workdir}/mlflow.db"]
    configs = {side: validate_train(compose_command_line("train", [*overrides, *outputs, *extra])[0])
               for side, extra in SIDES.items()}
    first = configs["fused"]
    datamodule = build_datamodule(first)
    datamodule.setup()
    loaded = []
    for batch in datamodule.train_dataloader():  # an epoch's batches, then again, until there are enough
        loaded.append(batch)
        if len(loaded) == batches:
            break
    loaded = (loaded * (batches // len(loaded) + 1))[:batches]
    torch.manual_seed(first.seed)
    model = build_seq2seq(model_config(first, len(datamodule.src_vocab), len(datamodule.tgt_vocab)))
    accumulate = first.trainer.accumulate_grad_batches or 1
    clip = first.trainer.gradient_clip_val
    sides = {}
    for side, cfg in configs.items():
        twin = copy.deepcopy(model).train()
        sides[side] = {"model": twin, "optimizer": optimizer_factory(cfg.optimizer)(twin.parameters()),
                       "ms": [], "step_ms": []}
    for i, batch in enumerate(loaded):
        order = list(sides) if i % 2 else list(reversed(sides))
        for side in order:
            s = sides[side]
            began = time.perf_counter()
            logits, _ = s["model"](batch.src, batch.src_lengths, batch.tgt_in)
            (loss_fn(logits, batch.tgt_out) / accumulate).backward()
            stepping = time.perf_counter()
            if (i + 1) % accumulate == 0:
                if clip:
                    torch.nn.utils.clip_grad_norm_(s["model"].parameters(), clip)
                s["optimizer"].step()
                s["optimizer"].zero_grad(set_to_none=True)
            ended = time.perf_counter()
            if i >= warmup:
                s["ms"].append(1e3 * (ended - began))
                s["step_ms"].append(1e3 * (ended - stepping))
    return {side: {"ms": s["ms"], "step_ms": s["step_ms"], "fused": bool(s["optimizer"].param_groups[0].get("fused"))}
            for side, s in sides.items()}


def render(found: dict[str, dict], overrides: list[str], threads: int) -> str:
    fused, default = (found[side] for side in ("fused", "default"))
    lines = [
        f"`python benchmarks/optimizer_step.py {' '.join(overrides)}`".replace("  ", " "),
        f"({len(fused['ms'])} batches timed per side, {threads} thread(s)):",
        "",
        "| optimizer step | fused | ms per batch, median | mean | of which clipping and the step, mean |",
        "|---|---|---:|---:|---:|",
    ]
    for side, values in (("fused (attnseq's)", fused), ("PyTorch's default", default)):
        lines.append(f"| {side} | {'yes' if values['fused'] else 'no'} | {statistics.median(values['ms']):.2f} "
                     f"| {statistics.mean(values['ms']):.2f} | {statistics.mean(values['step_ms']):.3f} |")
    ratio = statistics.mean(default["ms"]) / statistics.mean(fused["ms"])
    lines += ["", f"PyTorch's default step / the fused one, mean ms per batch: **{ratio:.3f}×**"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="train.py overrides (default: copy at the benchmark's sizes)")
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    overrides = args.overrides or list(BENCHMARK_SIZES)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="optimizer-step-") as workdir:
        found = measure(overrides, args.batches, args.warmup, args.threads, Path(workdir))
    print(render(found, overrides, args.threads))


if __name__ == "__main__":
    main()
