"""Time to accuracy: seconds from launching a training until its validation exact match first
reaches a target, through the real CLI, beside a textbook baseline trained by a plain loop.

    .venv/bin/python benchmarks/time_to_accuracy.py              # 3 seeds → Markdown on stdout
    .venv/bin/python benchmarks/time_to_accuracy.py --defaults   # also the CLI without the preset
    .venv/bin/python benchmarks/time_to_accuracy.py --batching   # also the CLI with other training batches
    .venv/bin/python benchmarks/time_to_accuracy.py --init       # also the CLI with model.init=xavier
    .venv/bin/python benchmarks/time_to_accuracy.py --joey --batching --seeds 1   # JoeyNMT's reverse, to dev BLEU 90
    .venv/bin/python benchmarks/time_to_accuracy.py --quick      # a tiny task, one seed (what the tests run)

- **CLI**: ``python train.py experiment=copy_fast seed=N threads=T training.stop_at=0.95`` in a
  subprocess, writing to a SQLite store in a temporary folder. Its time runs from just before the
  launch to the timestamp MLflow recorded with the first ``val/exact_match`` ≥ the target (the
  logger's own clock, independent of the stop option, which only ends the process there): start-up,
  every validation before it and everything the CLI does between steps count.
- **textbook**: ``loops.TextbookBahdanau`` with its keys projected once, in a subprocess of this
  file (``--textbook-worker``): the same composed config gives it the same data and batch order,
  optimizer, schedule (stepped per epoch), gradient clipping and validation cadence; it validates
  greedy exact match on the same validation set and prints each result with its clock time.
- The two alternate, seed by seed, so a machine whose load changes slows both alike. A run that
  has not reached the target within ``--budget`` seconds is stopped and counted as not reached.
- ``--batching``: the CLI also trains with each of ``BATCHINGS`` (random batches, and length-bucketed
  ones sorted in pools of other sizes), in the same alternation: a batching that makes each step faster
  but learns less per step shows here as a later time to the target, whatever its tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.95
METRIC = "val/exact_match"
TASK = (
    "experiment=copy_fast",  # copy 5-40, the default model, its schedule and cadence: conf/experiment/copy_fast.yaml
    "dataset.batch_size=64",
    "model.embedding_dim=64",
    "model.hidden_size=128",
)
DEFAULTS_TASK = (  # the same task on conf/train.yaml's own schedule and cadence
    "dataset.train_lengths=[5,40]",
    "dataset.eval_lengths=[5,40]",
    "dataset.batch_size=64",
    "model.embedding_dim=64",
    "model.hidden_size=128",
    "trainer.max_epochs=10",
)
BATCHINGS = {  # --batching: how the training batches are made (conf/dataset/base/symbols.yaml: bucket_pool)
    "cli, random batches": ("dataset.length_bucketing=false",),
    "cli, pools of 4 batches": ("dataset.bucket_pool=4",),
    "cli, pools of 50 batches": ("dataset.bucket_pool=50",),
}
INITS = {  # --init: the task's weights drawn by the other scheme (conf/train.yaml: model.init)
    "copy": {"cli, model.init=xavier": ("model.init=xavier",)},
    "joey": {"cli, model.init=torch": ("model.init=torch",)},  # the preset draws them as JoeyNMT does
}
JOEY_TASK = (  # JoeyNMT's reverse tutorial (conf/experiment/joey_reverse.yaml), validated 8 times an epoch
    "experiment=joey_reverse",
    "trainer.max_epochs=2",
    "trainer.val_check_interval=0.125",
    "training.test_after_fit=false",
)
JOEY_METRIC, JOEY_TARGET = "val/sacrebleu", 90.0  # JoeyNMT publishes 95.4 dev BLEU after 5 epochs
QUICK_TASK = (
    "dataset.train_lengths=[1,5]",
    "dataset.eval_lengths=[1,5]",
    "dataset.train_size=256",
    "dataset.val_size=64",
    "dataset.test_size=64",
    "model.embedding_dim=8",
    "model.hidden_size=16",
    "trainer.max_epochs=2",
    "trainer.val_check_interval=0.5",
    "tracking.heatmap_samples=0",
)


@dataclass
class Settings:
    seeds: list[int]
    target: float
    budget_s: float  # per training: beyond it, stopped and not reached
    threads: int
    task: tuple[str, ...]  # the CLI's overrides; the textbook composes the same config
    defaults_task: tuple[str, ...] | None = None  # also the CLI on these overrides (today's defaults)
    variants: dict[str, tuple[str, ...]] = field(default_factory=dict)  # also the CLI with these added, by name
    metric: str = METRIC
    textbook: bool = True  # the textbook trains the default model only: not JoeyNMT's


@dataclass
class Attempt:
    """One training: every validation result as (seconds since launch, step, exact match)."""

    who: str
    seed: int
    validations: list[tuple[float, int, float]] = field(default_factory=list)
    wall_s: float = 0.0  # launch to exit (or to the stop at the budget)
    target: float = TARGET
    run_id: str | None = None  # the CLI's MLflow run, in its folder's store (``mlflow.db``)

    @property
    def reached(self) -> tuple[float, int] | None:
        """(seconds, step) of the first validation at or above the target; None if none was."""
        return next(((s, step) for s, step, value in self.validations if value >= self.target), None)

    @property
    def seconds(self) -> float | None:
        return None if self.reached is None else self.reached[0]


# ---- the CLI


def cli_command(settings: Settings, task: tuple[str, ...], seed: int, workdir: Path) -> list[str]:
    return [
        sys.executable,
        str(REPO / "train.py"),
        *task,
        f"seed={seed}",
        f"threads={settings.threads}",
        f"training.stop_at={settings.target}",
        f"mlflow.tracking_uri=sqlite:///{workdir}/mlflow.db",
        "mlflow.experiment_name=time_to_accuracy",
        f"paths.output_dir={workdir}/out",
    ]


def run_cli(settings: Settings, task: tuple[str, ...], seed: int, workdir: Path, who: str = "cli",
            launcher: Callable[[list[str]], list[str]] | None = None) -> Attempt:
    """One CLI training from launch; its validations read back from its MLflow store. ``launcher``: the
    command line actually run, from ``cli_command``'s (``run_breakdown`` times its phases)."""
    from mlflow.tracking import MlflowClient

    workdir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ATTNSEQ_"))}
    with open(workdir / "train.log", "w") as log:
        launched = time.time()
        command = cli_command(settings, task, seed, workdir)
        process = subprocess.Popen(
            command if launcher is None else launcher(command), cwd=workdir, env=env, stdout=log,
            stderr=subprocess.STDOUT,
        )  # from its folder: Hydra's outputs/ and the store's ./mlruns land there, not in the checkout
        stopped = wait(process, settings.budget_s)
        wall = time.time() - launched
    if process.returncode != 0 and not stopped:
        tail = (workdir / "train.log").read_text()[-3000:]
        raise RuntimeError(f"train.py exited with {process.returncode}:\n{tail}")
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow.db")
    runs = client.search_runs(client.get_experiment_by_name("time_to_accuracy").experiment_id)
    history = sorted(client.get_metric_history(runs[0].info.run_id, settings.metric), key=lambda m: m.timestamp)
    validations = [(m.timestamp / 1000 - launched, m.step + 1, m.value) for m in history]  # step: batches trained
    return Attempt(who, seed, validations, wall, settings.target, runs[0].info.run_id)


def wait(process: subprocess.Popen, budget_s: float) -> bool:
    """Wait for the process; stop it at the budget. True if it was stopped."""
    try:
        process.wait(timeout=budget_s)
        return False
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return True


# ---- the textbook baseline


def run_textbook(settings: Settings, task: tuple[str, ...], seed: int) -> Attempt:
    """One textbook training from launch, in a subprocess of this file."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--textbook-worker",
        f"--seed={seed}",
        f"--threads={settings.threads}",
        f"--target={settings.target}",
        f"--budget={settings.budget_s}",
        "--",
        *task,
    ]
    launched = time.time()
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=settings.budget_s + 120)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    wall = time.time() - launched
    if process.returncode != 0:
        raise RuntimeError(f"the textbook worker exited with {process.returncode}:\n{err[-3000:]}")
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    validations = [(line["time"] - launched, line["step"], line["exact_match"]) for line in lines]
    return Attempt("textbook", seed, validations, wall, settings.target)


def validation_every(trainer_cfg, batches_per_epoch: int) -> int:
    """Batches between validations, as Lightning reads ``val_check_interval`` (a fraction of the
    epoch, or a whole number of batches)."""
    interval = trainer_cfg.get("val_check_interval")
    if interval is None:
        return batches_per_epoch
    if isinstance(interval, float):
        return max(1, int(batches_per_epoch * interval))
    return int(interval)


def textbook_worker(seed: int, threads: int, target: float, budget_s: float, overrides: list[str]) -> None:
    """Train the textbook model as the composed config says; print one JSON line per validation."""
    started = time.time()
    import torch
    from cases import KEY_ADDITIVE, compose_case
    from loops import TextbookBahdanau, loss_fn

    from attnseq.config import validate_train
    from attnseq.training.build import build_datamodule, optimizer_factory, partial

    torch.set_num_threads(threads)
    cfg = compose_case(KEY_ADDITIVE, [*overrides, f"seed={seed}"])  # the default model, as train.py composes it
    typed = validate_train(cfg)
    datamodule = build_datamodule(typed)
    datamodule.setup()
    torch.manual_seed(seed)
    model = TextbookBahdanau(
        len(datamodule.src_vocab),
        len(datamodule.tgt_vocab),
        cfg.model.embedding_dim,
        cfg.model.hidden_size,
        project_keys_once=True,
    )
    optimizer = optimizer_factory(typed.optimizer)(model.parameters())  # as train() makes it
    # as train.py builds it: scheduler.interval is attnseq's, not an argument of the class (stepped per epoch here)
    scheduler = partial("scheduler._target_", typed.scheduler)(optimizer) if typed.scheduler is not None else None
    clip = cfg.trainer.get("gradient_clip_val")
    loader = datamodule.train_dataloader()
    every = validation_every(cfg.trainer, len(loader))
    validation = list(datamodule.val_dataloader())
    step = 0
    for epoch in range(cfg.trainer.max_epochs):
        loader.batch_sampler.set_epoch(epoch)
        for batch_idx, batch in enumerate(loader):
            model.train()
            logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)  # (B, T_dec, V)
            loss = loss_fn(logits, batch.tgt_out)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            step += 1
            if time.time() - started > budget_s:
                return
            if (batch_idx + 1) % every == 0 or batch_idx + 1 == len(loader):
                value = exact_match(model, validation, cfg.decode.max_length_ratio, cfg.decode.max_length_extra)
                print(json.dumps({"time": time.time(), "step": step, "exact_match": value}), flush=True)
                if value >= target:
                    return
        if scheduler is not None:
            scheduler.step()


def exact_match(model, batches, ratio: float, extra: int) -> float:
    """Greedy exact match of the textbook model over ``batches``: every real target position
    (EOS included) right, as ``LengthBucketedAccuracy`` counts it."""
    model.eval()
    exact = total = 0
    for batch in batches:
        limit = int(int(batch.src_lengths.max()) * ratio) + extra
        tokens = model.greedy(batch.src, batch.src_lengths, limit)  # (B, T_out)
        exact += int(exact_rows(tokens, batch.tgt_out, batch.tgt_lengths).sum())
        total += len(batch)
    model.train()
    return exact / total if total else 0.0


def exact_rows(tokens, target, target_lengths):
    """(B,) whether each row's tokens match ``target`` at all its ``target_lengths`` real positions."""
    import torch

    t_tgt = target.shape[1]
    if tokens.shape[1] < t_tgt:
        tokens = torch.cat([tokens, tokens.new_full((tokens.shape[0], t_tgt - tokens.shape[1]), -1)], dim=1)
    tokens = tokens[:, :t_tgt]  # (B, T_tgt)
    real = torch.arange(t_tgt)[None, :] < target_lengths[:, None]  # (B, T_tgt)
    return ((tokens == target) | ~real).all(dim=1)  # (B,)


# ---- the run and its report


def measure(settings: Settings, log=print, workdir: Path | None = None) -> list[Attempt]:
    """Seed by seed: the CLI, the textbook, and (``defaults_task``) the CLI on today's defaults."""
    attempts = []
    with tempfile.TemporaryDirectory(prefix="attnseq-tta-") as tmp:
        root = workdir or Path(tmp)
        for seed in settings.seeds:
            seed_attempts = [run_cli(settings, settings.task, seed, root / f"cli-{seed}")]
            if settings.textbook:
                seed_attempts.append(run_textbook(settings, settings.task, seed))
            if settings.defaults_task:
                seed_attempts.append(
                    run_cli(settings, settings.defaults_task, seed, root / f"defaults-{seed}", who="cli, defaults")
                )
            for number, (who, overrides) in enumerate(settings.variants.items()):
                seed_attempts.append(
                    run_cli(settings, (*settings.task, *overrides), seed, root / f"variant{number}-{seed}", who=who)
                )
            for attempt in seed_attempts:
                log(f"{attempt.who:14s} seed {seed}: {describe(attempt)} (wall {attempt.wall_s:.0f} s)")
            attempts += seed_attempts
    return attempts


def describe(attempt: Attempt) -> str:
    if attempt.reached is None:
        best = max((value for _, _, value in attempt.validations), default=0.0)
        return f"not reached (best {best:.3f} in {attempt.wall_s:.0f} s)"
    seconds, step = attempt.reached
    return f"{seconds:.0f} s (step {step})"


def median_seconds(attempts: list[Attempt]) -> float | None:
    """The median over seeds, a run not reached counting as slower than any reached; None if the
    median itself is not reached."""
    return median_reached([a.seconds for a in attempts])


def median_reached(seconds: list[float | None]) -> float | None:
    """The median of ``seconds``, None (not reached) counting as slower than any number; None if that median is
    itself not reached (with an even count, if the higher middle is not), or there is none."""
    if not seconds:
        return None
    middle = statistics.median(value if value is not None else float("inf") for value in seconds)
    return None if middle == float("inf") else middle


def render(settings: Settings, attempts: list[Attempt], command: str | None = None, machine: str | None = None,
           commit: str | None = None) -> str:
    """The section's Markdown; ``command``, ``machine`` and ``commit`` head it when it stands alone."""
    whos = list(dict.fromkeys(a.who for a in attempts))
    by = {who: [a for a in attempts if a.who == who] for who in whos}
    provenance = {"command": command and f"`{command}`", "commit": commit, "machine": machine}
    lines = [
        "## Time to accuracy",
        "",
        *(f"- {key}: {value}" for key, value in provenance.items() if value),
        f"- task: the CLI's overrides `{' '.join(settings.task)}`; {settings.threads} threads; "
        f"target: `{settings.metric}` ≥ {settings.target}; budget {settings.budget_s:.0f} s per training; "
        f"seeds {', '.join(map(str, settings.seeds))}, alternating "
        f"{'CLI and textbook' if settings.textbook else 'the CLI runs'}",
        "- `cli`: seconds from launching `train.py` to the MLflow timestamp of the first "
        f"`{settings.metric}` ≥ the target (start-up, every validation before it, checkpoints and plots included)"
        + ("; `textbook`: `loops.TextbookBahdanau` (keys projected once) in a plain loop, launched the same way, "
           "with the same data, optimizer, schedule, clipping and validation cadence" if settings.textbook else ""),
        "",
        "| training | median s | " + " | ".join(f"seed {s}" for s in settings.seeds) + " |",
        "|---|---:|" + "---:|" * len(settings.seeds),
    ]
    for who in whos:
        median = median_seconds(by[who])
        cells = [describe(a) for a in by[who]]
        lines.append(f"| {who} | {'not reached' if median is None else f'{median:.0f}'} | {' | '.join(cells)} |")
    cli, textbook = median_seconds(by.get("cli", [])), median_seconds(by.get("textbook", []))
    if cli is not None and textbook is not None:
        lines += ["", f"CLI / textbook: {cli / textbook:.2f}× the textbook's time (median over seeds)."]
    if settings.defaults_task:
        lines += [
            "",
            "`cli, defaults`: the same task on conf/train.yaml's own schedule and cadence "
            f"(`{' '.join(settings.defaults_task)}`).",
        ]
    if settings.variants:
        lines += ["", "The CLI with other training batches (the task's overrides, then these):", ""]
        lines += [f"- `{who}`: `{' '.join(overrides)}`" for who, overrides in settings.variants.items()]
    return "\n".join(lines) + "\n"


def make_settings(args: argparse.Namespace) -> Settings:
    if args.quick:
        return Settings(seeds=[0], target=args.target if args.target is not None else 0.0, budget_s=args.budget,
                        threads=args.threads, task=QUICK_TASK)
    if args.joey:
        return Settings(seeds=list(range(args.seeds)), target=args.target if args.target is not None else JOEY_TARGET,
                        budget_s=args.budget, threads=args.threads, task=JOEY_TASK,
                        variants={**(BATCHINGS if args.batching else {}), **(INITS["joey"] if args.init else {})},
                        metric=JOEY_METRIC, textbook=False)
    return Settings(
        seeds=list(range(args.seeds)),
        target=args.target if args.target is not None else TARGET,
        budget_s=args.budget,
        threads=args.threads,
        task=TASK,
        defaults_task=DEFAULTS_TASK if args.defaults else None,
        variants={**(BATCHINGS if args.batching else {}), **(INITS["copy"] if args.init else {})},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny task, one seed, target 0 (what the tests run)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    parser.add_argument("--target", type=float, default=None, help=f"exact match to reach (default {TARGET})")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds per training before it is stopped")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each training")
    parser.add_argument("--defaults", action="store_true", help="also the CLI on conf/train.yaml's own schedule")
    parser.add_argument("--batching", action="store_true", help="also the CLI with each of BATCHINGS")
    parser.add_argument("--init", action="store_true", help="also the CLI with the weights drawn by the other "
                        "model.init scheme")
    parser.add_argument("--joey", action="store_true", help=f"JoeyNMT's reverse task to {JOEY_METRIC} ≥ {JOEY_TARGET} "
                        "(no textbook: it trains the default model only)")
    parser.add_argument("--textbook-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.textbook_worker:
        textbook_worker(args.seed, args.threads, args.target, args.budget, args.overrides)
        return 0
    settings = make_settings(args)
    attempts = measure(settings, log=lambda line: print(line, file=sys.stderr, flush=True))
    from machine import git_state, machine_line

    shown = " ".join(argv if argv is not None else sys.argv[1:])
    print(render(settings, attempts, f"python benchmarks/time_to_accuracy.py {shown}".strip(), machine_line("cpu"),
                 git_state()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
