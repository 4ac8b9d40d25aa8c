"""The GPU check (``make gpu-check``): every decoder family × every scorer on CUDA, in float32 and
under bf16 autocast, on the same batch from the same weights; which kernels each takes; training
throughput beside the CPU table; one short ``train.py trainer=gpu`` into MLflow.

Per case (``check_cases``: the registries' scorer × decoder grid, each on the first encoder that
accepts it, then one case for each encoder not yet used):

- a loss that is finite in both precisions, |loss_bf16 − loss_fp32| / loss_fp32 ≤ ``--loss-rtol``,
  and the attention weights within ``--weights-atol`` (max abs difference) and the gradient within
  ``--grad-rtol`` (‖g_bf16 − g_fp32‖ / ‖g_fp32‖) of float32's. bf16 keeps 8 significant bits, a
  relative rounding error of up to 2⁻⁸ ≈ 0.4% per value; the loss (cross-entropy, which autocast
  computes in float32 from bf16 logits) averages many such errors, so 1% is a few roundings' worth,
  and a real bug (a mask, a cast, an overflow) moves it by far more. The weights are probabilities:
  0.02 is five roundings of the largest weight (a softmax of bf16 scores); the gradient passes
  through every layer and step, each adding its own rounding: 10%.
- the kernels: the autograd nodes of the backward graph that are attnseq's own kernels
  (``attnseq.kernels``' autograd functions) and cuDNN's RNN (``CudnnRnnBackward0``). Required: no
  attnseq kernel under bf16 autocast (each declares it runs outside autocast only); on CUDA
  cuDNN enabled, an RNN encoder's recurrence in cuDNN and neither whole-sequence RNN kernel (they
  pay on CPU only). Those attnseq kernels that float32 on CUDA takes are listed, not rejected.
- target tokens/s over ``--steps`` training steps after ``--warmup`` (Adam + clipping from the
  config: ``benchmarks.loops.Loop``), in each precision, beside the CPU table's minimal loop
  (benchmarks/results.md).

``--dry-run``: the same on CPU (bf16 autocast works there too) at tiny sizes, with the training
run on ``trainer.accelerator=cpu`` (conf/trainer/gpu.yaml's bf16-mixed otherwise), so that CI checks
the script's logic. Exit status 1 on any failure, each one named; 2 when CUDA is asked for and absent.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import inspect
import itertools
import math
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from cases import DECODERS, REPO, Case, accepts, compose_case, encoders  # benchmarks/ first on sys.path
from loops import Loop, loss_fn
from omegaconf import OmegaConf
from torch import Tensor, nn

import attnseq.kernels
from attnseq.attention import NO_ATTENTION, SCORERS
from attnseq.config import validate_train
from attnseq.kernels.gru_sequence import GRUSequence
from attnseq.kernels.lstm_sequence import LSTMSequence
from attnseq.model import build_seq2seq
from attnseq.training.build import build_datamodule, model_config

CUDNN_RNN = "CudnnRnnBackward0"
WHOLE_SEQUENCE_RNNS = (GRUSequence.__name__, LSTMSequence.__name__)
"""attnseq's whole-sequence RNN kernels: on CUDA cuDNN's RNN runs instead."""
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class Tolerances:
    loss_rtol: float = 0.01
    weights_atol: float = 0.02
    grad_rtol: float = 0.10


@dataclass(frozen=True)
class Sizes:
    """What a case trains on: the benchmark's data and model on a GPU, tiny ones for the dry run."""

    embedding: int
    hidden: int
    lengths: tuple[int, int]
    batch: int
    train_size: int
    warmup: int
    steps: int


GPU_SIZES = Sizes(64, 128, (5, 40), 64, 64 * 12, warmup=5, steps=20)  # benchmarks/results.md's setting
DRY_SIZES = Sizes(8, 16, (2, 5), 4, 8, warmup=0, steps=1)


@dataclass
class Outcome:
    case: Case
    losses: dict[str, float] = field(default_factory=dict)
    weights_diff: float | None = None  # max |α_bf16 − α_fp32|; None without attention weights
    grad_diff: float = math.nan  # ‖g_bf16 − g_fp32‖ / ‖g_fp32‖
    kernels: dict[str, list[str]] = field(default_factory=dict)  # precision → attnseq kernels taken
    cudnn: dict[str, int] = field(default_factory=dict)  # precision → cuDNN RNN nodes
    rates: dict[str, float] = field(default_factory=dict)  # precision → target tokens/s
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what torch warned of in the two passes

    @property
    def loss_diff(self) -> float:
        return abs(self.losses["bf16"] - self.losses["fp32"]) / abs(self.losses["fp32"])


def check_cases(sizes: Sizes) -> list[Case]:
    """Every registered scorer × every decoder family, each on the first encoder (conf/encoder/
    order) that the config at ``sizes`` accepts with it; then the no-attention baseline; then one
    case for each encoder not yet used, with the first scorer and decoder it accepts."""
    def valid(case: Case) -> bool:
        return accepts(sized_config(case, sizes))

    cases = []
    for scorer in SCORERS:
        for decoder in DECODERS:
            first = next((case for e in encoders() if valid(case := Case(e, scorer, decoder))), None)
            if first is not None:
                cases.append(first)
    cases.append(Case(encoders()[0], NO_ATTENTION))
    for encoder in encoders():
        if encoder not in {case.encoder for case in cases}:
            grid = itertools.product(SCORERS, DECODERS)
            cases.append(next(c for s, d in grid if valid(c := Case(encoder, s, d))))
    return cases


def kernel_functions() -> frozenset[str]:
    """The names of the autograd functions defined in ``attnseq.kernels``' modules."""
    names = set()
    for module_info in pkgutil.iter_modules(attnseq.kernels.__path__):
        module = importlib.import_module(f"attnseq.kernels.{module_info.name}")
        names |= {
            name for name, value in vars(module).items()
            if inspect.isclass(value) and issubclass(value, torch.autograd.Function)
            and value.__module__ == module.__name__
        }
    return frozenset(names)


def graph_nodes(loss: Tensor) -> list[str]:
    """The class names of every node of ``loss``'s backward graph."""
    seen, stack, names = set(), [loss.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def kernels_taken(nodes: list[str], kernels: frozenset[str]) -> list[str]:
    """attnseq's kernels among the graph's nodes (a custom function ``F``'s node is ``FBackward``)."""
    return sorted({name.removesuffix("Backward") for name in nodes} & kernels)


def kernel_problems(device: str, precision: str, taken: list[str], cudnn_nodes: int, rnn_encoder: bool,
                    cudnn_enabled: bool) -> list[str]:
    """What the check requires of the kernels of one forward/backward pass (see the module's docstring)."""
    problems = []
    if precision == "bf16" and taken:
        problems.append(f"bf16 autocast took attnseq kernels {taken}: they run outside autocast only")
    if device == "cuda":
        if not cudnn_enabled:
            problems.append("torch.backends.cudnn.enabled is False: set it back to True (the default)")
        if whole := [name for name in taken if name in WHOLE_SEQUENCE_RNNS]:
            problems.append(f"{precision} on CUDA took {whole}, which pay on CPU only: cuDNN's RNN should run")
        if rnn_encoder and cudnn_nodes == 0:
            problems.append(f"{precision} on CUDA: the RNN encoder did not run in cuDNN (no {CUDNN_RNN} node)")
    return problems


def numeric_problems(outcome: Outcome, tolerances: Tolerances) -> list[str]:
    problems = [f"{precision} loss is {loss}" for precision, loss in outcome.losses.items() if not math.isfinite(loss)]
    if problems:
        return problems
    if outcome.loss_diff > tolerances.loss_rtol:
        problems.append(f"bf16 loss {outcome.losses['bf16']:.6f} vs fp32 {outcome.losses['fp32']:.6f}: relative "
                        f"difference {outcome.loss_diff:.2e} > --loss-rtol {tolerances.loss_rtol}")
    if outcome.weights_diff is not None and not outcome.weights_diff <= tolerances.weights_atol:
        problems.append(f"attention weights differ by up to {outcome.weights_diff:.2e} > --weights-atol "
                        f"{tolerances.weights_atol}")
    if not outcome.grad_diff <= tolerances.grad_rtol:
        problems.append(f"gradient's relative difference {outcome.grad_diff:.2e} > --grad-rtol {tolerances.grad_rtol}")
    return problems


@functools.cache
def sized_config(case: Case, sizes: Sizes):
    """conf/train.yaml composed for ``case`` on the copy task at ``sizes`` (read-only; composed once
    per process: Hydra's composition is most of what the dry run costs)."""
    lengths = f"[{sizes.lengths[0]},{sizes.lengths[1]}]"
    cfg = compose_case(case, [
        "dataset=copy", f"dataset.train_lengths={lengths}", f"dataset.eval_lengths={lengths}",
        f"dataset.train_size={sizes.train_size}", f"dataset.val_size={sizes.batch}", f"dataset.test_size={sizes.batch}",
        f"dataset.batch_size={sizes.batch}", f"model.embedding_dim={sizes.embedding}",
        f"model.hidden_size={sizes.hidden}",
        "model.dropout=0.0",  # the same function in both precisions: no random masks
    ])
    OmegaConf.set_readonly(cfg, True)
    return cfg


def one_pass(model: nn.Module, batch, device: str, precision: str) -> tuple[Tensor, Tensor | None, list[str]]:
    """Forward and backward on ``batch``: the loss, the attention weights (float32) and the graph's nodes;
    the gradients stay on the parameters."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits, weights = model(batch.src, batch.src_lengths, batch.tgt_in)  # (B, T_dec, V), (B, H, T_dec, T_enc)
        loss = loss_fn(logits, batch.tgt_out)
    nodes = graph_nodes(loss)
    loss.backward()
    return loss.detach().float(), None if weights is None else weights.detach().float(), nodes


def gradient(model: nn.Module) -> Tensor:
    return torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])  # (P,)


def throughput(model: nn.Module, batches: list, cfg, device: str, precision: str, sizes: Sizes) -> float:
    """Target tokens per second of ``sizes.steps`` training steps after ``sizes.warmup``."""
    needed = sizes.warmup + sizes.steps
    loop = Loop(model, list(itertools.islice(itertools.cycle(batches), needed)), cfg, device,
                bf16=precision == "bf16")
    for _ in range(needed):
        loop.step()
    return sum(loop.tokens[sizes.warmup:]) / sum(loop.durations[sizes.warmup:])


def check_case(case: Case, device: str, sizes: Sizes, tolerances: Tolerances, kernels: frozenset[str]) -> Outcome:
    outcome = Outcome(case)
    cfg = sized_config(case, sizes)
    config = validate_train(cfg)
    datamodule = build_datamodule(config)
    datamodule.setup()
    torch.manual_seed(config.seed)
    model = build_seq2seq(model_config(config, len(datamodule.src_vocab), len(datamodule.tgt_vocab)))
    initial = copy.deepcopy(model.state_dict())
    model.to(device).train()
    batches = [b.to(device) for b in datamodule.train_dataloader()]
    longest = max(batches, key=lambda b: b.src.shape[1])
    rnn_encoder = any(isinstance(m, nn.RNNBase) for m in model.encoder.modules())
    weights, grads = {}, {}
    for precision in PRECISIONS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss, weights[precision], nodes = one_pass(model, longest, device, precision)
        outcome.warnings += sorted({f"{precision}: {w.message}" for w in caught})
        grads[precision] = gradient(model)
        outcome.losses[precision] = float(loss)
        outcome.kernels[precision] = kernels_taken(nodes, kernels)
        outcome.cudnn[precision] = nodes.count(CUDNN_RNN)
        outcome.problems += kernel_problems(device, precision, outcome.kernels[precision], outcome.cudnn[precision],
                                            rnn_encoder, torch.backends.cudnn.enabled)
    if weights["fp32"] is not None:
        outcome.weights_diff = float((weights["bf16"] - weights["fp32"]).abs().max())
    outcome.grad_diff = float((grads["bf16"] - grads["fp32"]).norm() / grads["fp32"].norm())
    outcome.problems = numeric_problems(outcome, tolerances) + outcome.problems
    for precision in PRECISIONS:
        model.load_state_dict(initial)
        outcome.rates[precision] = throughput(model, batches, cfg, device, precision, sizes)
    return outcome


def cpu_rates(results: Path = REPO / "benchmarks" / "results.md") -> dict[str, str]:
    """The CPU table's minimal-loop tokens/s by case (benchmarks/results.md, "Training throughput")."""
    if not results.exists():
        return {}
    text = results.read_text()
    section = text.split("## Training throughput", 1)[-1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): cells[4].strip() for cells in rows if len(cells) > 4 and "/" in cells[0]}


def table(outcomes: list[Outcome]) -> str:
    cpu = cpu_rates()
    lines = [
        "| encoder / scorer / decoder | loss fp32 | Δloss rel | max Δα | Δgrad rel | fp32 tok/s | bf16 tok/s "
        "| bf16 / fp32 | CPU minimal loop tok/s (results.md) | attnseq kernels fp32 | bf16 "
        "| cuDNN RNN nodes fp32 / bf16 | check |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|",
    ]
    for o in outcomes:
        weights = "—" if o.weights_diff is None else f"{o.weights_diff:.1e}"
        kernels = {precision: ", ".join(o.kernels[precision]) or "—" for precision in PRECISIONS}
        lines.append(
            f"| {o.case.name} | {o.losses['fp32']:.4f} | {o.loss_diff:.1e} | {weights} | {o.grad_diff:.1e} "
            f"| {o.rates['fp32']:,.0f} | {o.rates['bf16']:,.0f} | {o.rates['bf16'] / o.rates['fp32']:.2f}× "
            f"| {cpu.get(o.case.name, '—')} | {kernels['fp32']} | {kernels['bf16']} "
            f"| {o.cudnn['fp32']} / {o.cudnn['bf16']} | {'FAIL' if o.problems else 'pass'} |"
        )
    return "\n".join(lines) + "\n"


TINY_TRAINING = [
    "dataset.train_size=256", "dataset.val_size=64", "dataset.test_size=64", "dataset.train_lengths=[2,8]",
    "dataset.eval_lengths=[2,8]", "model.hidden_size=32", "model.embedding_dim=16", "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
]


def training_run(workdir: Path, dry_run: bool, timeout_s: float) -> list[str]:
    """One short ``train.py trainer=gpu`` (on CPU for the dry run) into a fresh store under ``workdir``:
    the problems, none when exactly one run FINISHED."""
    from attnseq.tracking.client import TrackingClient

    uri = f"sqlite:///{workdir}/train/mlflow.db"
    (workdir / "train").mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(REPO / "train.py"), "trainer=gpu", *TINY_TRAINING,
               *(["trainer.accelerator=cpu"] if dry_run else []), f"mlflow.tracking_uri={uri}",
               "mlflow.experiment_name=gpu_check", f"hydra.run.dir={workdir}/train/out"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ATTNSEQ_"))}
    try:
        proc = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [f"train.py trainer=gpu ran past {timeout_s:.0f} s"]
    if proc.returncode != 0:
        return [f"train.py trainer=gpu exited {proc.returncode}:\n{proc.stderr[-3000:]}"]
    client = TrackingClient(uri)
    experiment = client.experiment_id("gpu_check")
    runs = client.runs([experiment]) if experiment is not None else []
    statuses = [run.info.status for run in runs]
    if statuses != ["FINISHED"]:
        return [f"train.py trainer=gpu left runs {statuses} in {uri}, not one FINISHED run"]
    precision = client.params(runs[0].info.run_id).get("trainer.precision")
    if precision != "bf16-mixed":
        return [f"train.py trainer=gpu logged trainer.precision={precision}, not bf16-mixed"]
    return []


def select(cases: list[Case], patterns: list[str]) -> list[Case]:
    return [c for c in cases if not patterns or any(re.fullmatch(p, c.name) for p in patterns)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="on CPU at tiny sizes: checks this script's logic")
    parser.add_argument("--cases", nargs="*", default=[], help="regular expressions over case names (default: all)")
    parser.add_argument("--loss-rtol", type=float, default=Tolerances.loss_rtol)
    parser.add_argument("--weights-atol", type=float, default=Tolerances.weights_atol)
    parser.add_argument("--grad-rtol", type=float, default=Tolerances.grad_rtol)
    parser.add_argument("--no-train", action="store_true", help="skip the train.py trainer=gpu run")
    parser.add_argument("--train-timeout", type=float, default=300.0, help="seconds for the train.py run")
    parser.add_argument("--out", type=Path, help="write the markdown table here too")
    parser.add_argument("--workdir", type=Path, help="data, stores and outputs (default: a temporary folder)")
    args = parser.parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA device is present (torch.cuda.is_available() is False); nothing was checked. "
              "`python benchmarks/gpu_check.py --dry-run` runs the same logic on CPU.", file=sys.stderr)
        return 2
    tolerances = Tolerances(args.loss_rtol, args.weights_atol, args.grad_rtol)
    sizes = DRY_SIZES if args.dry_run else GPU_SIZES
    with tempfile.TemporaryDirectory(prefix="attnseq-gpu-check-") as scratch:
        workdir = (args.workdir or Path(scratch)).resolve()
        began = time.perf_counter()
        cases = select(check_cases(sizes), args.cases)
        if not cases:
            print(f"gpu-check: no case matches {args.cases}", file=sys.stderr)
            return 1
        kernels = kernel_functions()
        outcomes = [check_case(case, device, sizes, tolerances, kernels) for case in cases]
        train_problems = [] if args.no_train else training_run(workdir, args.dry_run, args.train_timeout)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"
    report = (
        f"device: {name}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()} "
        f"(enabled: {torch.backends.cudnn.enabled}); batch {sizes.batch}, "
        f"lengths {sizes.lengths[0]}–{sizes.lengths[1]}, "
        f"emb {sizes.embedding} / hidden {sizes.hidden}; tokens/s over {sizes.steps} steps after {sizes.warmup}; "
        f"tolerances {tolerances}; {time.perf_counter() - began:.0f} s\n\n" + table(outcomes)
    )
    print(report)
    if args.out:
        args.out.write_text(report)
    failures = [f"{o.case.name}: {problem}" for o in outcomes for problem in o.problems]
    failures += [f"training run: {problem}" for problem in train_problems]
    cuda_fp32 = sorted({k for o in outcomes for k in o.kernels["fp32"]}) if device == "cuda" else []
    if cuda_fp32:
        print(f"note: float32 on CUDA takes attnseq kernels {cuda_fp32} (not gated to CPU); trainer=gpu runs "
              "bf16-mixed, where they are off")
    for o in outcomes:
        for warning in o.warnings:
            print(f"note: {o.case.name} warned, {warning}")
    if failures:
        print(f"gpu-check FAILED ({len(failures)}):\n" + "\n".join(f"- {f}" for f in failures), file=sys.stderr)
        return 1
    print(f"gpu-check passed: {len(outcomes)} cases" + ("" if args.no_train else " and the training run"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
