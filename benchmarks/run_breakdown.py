"""Where the wall time of a ``copy_fast`` training goes, from launch to exit (issue 28, point 2): start-up,
data, training steps, validation decoding, metrics, plots and uploads, each phase's own seconds.

    .venv/bin/python benchmarks/run_breakdown.py              # 1 seed → Markdown on stdout
    .venv/bin/python benchmarks/run_breakdown.py --seeds 3    # medians of 3
    .venv/bin/python benchmarks/run_breakdown.py --joey       # JoeyNMT's reverse task, to dev BLEU 90

- The training is ``time_to_accuracy``'s CLI one (``experiment=copy_fast`` with its sizes, stopping at the first
  validation with 95% exact match), launched the same way, with each function of ``BREAKDOWN`` wrapped as its
  module is imported (``startup.TIMED_CHILD`` on the wall clock): a phase's seconds are its calls' own, the
  other phases' calls inside them taken out, so the rows add up to the run; "the rest" is the wall time no
  phase holds (the interpreter, Hydra's own work, Lightning's Trainer built, the exit).
- **to the target**: launch to the MLflow timestamp of the first validation at the target, as
  ``time_to_accuracy`` reads it; **to the exit**: launch to the process's end (the final heatmaps,
  checkpoints and MLflow model come after the target).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import startup  # benchmarks/ is first on sys.path for its scripts
import time_to_accuracy as tta

BREAKDOWN: list[tuple[str, list[str]]] = [
    ("start-up: config composed and checked (Hydra, pydantic)", ["attnseq.cli:checked_command_line"]),
    ("start-up: importing torch, Lightning, MLflow", ["attnseq.training.pipeline:<import>"]),
    ("start-up: tracking store checked, run opened", ["attnseq.training.pipeline:prepare",
                                                      "attnseq.training.pipeline:check_tracking_uri",
                                                      "attnseq.training.pipeline:open_run"]),
    ("data: examples made, vocabularies built", ["attnseq.data.datamodule:Seq2SeqDataModule.setup"]),
    ("model built", ["attnseq.training.pipeline:build_data_and_model"]),
    ("attention heatmaps: decoded and drawn", ["attnseq.training.artifacts:RunArtifacts.heatmap_images"]),
    ("attention explorer: decoded, importance, page", ["attnseq.training.artifacts:RunArtifacts.explorer_entries",
                                                        "attnseq.training.artifacts:RunArtifacts.log_explorer"]),
    ("accuracy-vs-length figures and curves", ["attnseq.training.artifacts:accuracy_vs_length",
                                               "attnseq.training.artifacts:figure_to_array",
                                               "attnseq.training.artifacts:log_length_curves"]),
    ("uploads: images, tables, texts, checkpoints, MLflow model", [
        "attnseq.tracking.run:TrackedRun.log_image_step", "attnseq.tracking.run:TrackedRun.log_image",
        "attnseq.tracking.run:TrackedRun.log_table", "attnseq.tracking.run:TrackedRun.log_text",
        "attnseq.tracking.run:TrackedRun.log_file", "attnseq.training.artifacts:UploadedCheckpoint.upload",
        "attnseq.training.artifacts:RunArtifacts.log_checkpoints"]),
    ("metrics, params and tags sent to MLflow", ["attnseq.tracking.run:TrackedRun.log_metrics",
                                                 "attnseq.tracking.run:TrackedRun.log_params",
                                                 "attnseq.tracking.run:TrackedRun.set_tags"]),
    ("checkpoints written to disk", ["attnseq.training.artifacts:NamedCheckpointIO.save_checkpoint"]),
    ("validation: greedy decoding", ["attnseq.model.decoding:greedy_decode"]),
    ("validation: teacher-forced pass, loss and metrics", [
        "attnseq.training.lit_module:Seq2SeqLitModule.validation_step",
        "attnseq.training.lit_module:Seq2SeqLitModule.on_validation_epoch_end"]),
    ("training steps (forward, backward, optimizer) and Lightning's loop", ["attnseq.training.pipeline:fit"]),
    ("run finished: flushed, marked FINISHED", ["attnseq.training.pipeline:finish"]),
]
"""The phases, in the order they claim a call: a function of an earlier phase called inside a later one's is
the earlier phase's (the heatmaps' decoding is the heatmaps', not validation's; ``fit`` keeps only what no
other phase holds: the training steps and Lightning's loop)."""
TRAINING = "training steps (forward, backward, optimizer) and Lightning's loop"
REST = "the rest: the interpreter, Hydra, Lightning's Trainer built, the exit"


@dataclass
class Breakdown:
    seed: int
    own_s: dict[str, float]  # phase → its own wall seconds; REST: what none holds
    target_s: float | None  # launch → the first validation at the target (MLflow's timestamp)
    last_validation_s: float  # launch → the last validation (MLflow's timestamp)
    wall_s: float  # launch → exit
    first_step_s: float | None  # the run's own record (attnseq.first_step_s): process start → first step
    validations: int


def launcher(phases_to: Path):
    """``cli_command``'s line run through ``startup.TIMED_CHILD`` on the wall clock, its phases written to
    ``phases_to``."""
    return lambda command: [command[0], "-c", startup.TIMED_CHILD, str(phases_to), "perf_counter",
                            json.dumps(BREAKDOWN), *command[1:]]


def measure_one(settings: tta.Settings, seed: int, workdir: Path) -> Breakdown:
    from mlflow.tracking import MlflowClient

    from attnseq.tracking.tags import FIRST_STEP_S

    timed = workdir.parent / f"phases-{seed}.json"
    attempt = tta.run_cli(settings, settings.task, seed, workdir, launcher=launcher(timed))
    measured = json.loads(timed.read_text())
    own = {label: seconds for (label, _), seconds in zip(BREAKDOWN, measured["own"])}
    own[REST] = attempt.wall_s - sum(own.values())
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow.db")
    run = client.search_runs(client.get_experiment_by_name("time_to_accuracy").experiment_id)[0]
    first_step = run.data.tags.get(FIRST_STEP_S)
    last = max((seconds for seconds, _, _ in attempt.validations), default=attempt.wall_s)
    return Breakdown(seed, own, attempt.seconds, last, attempt.wall_s,
                     None if first_step is None else float(first_step), len(attempt.validations))


def measure(seeds: list[int], threads: int, budget_s: float = 240.0, task: tuple[str, ...] = tta.TASK,
            target: float = tta.TARGET, metric: str = tta.METRIC, log=print) -> list[Breakdown]:
    settings = tta.Settings(seeds=seeds, target=target, budget_s=budget_s, threads=threads, task=task,
                            metric=metric, textbook=False)
    found = []
    with tempfile.TemporaryDirectory(prefix="attnseq-breakdown-") as tmp:
        for seed in seeds:
            found.append(measure_one(settings, seed, Path(tmp) / f"cli-{seed}"))
            shown = "not reached" if found[-1].target_s is None else f"{found[-1].target_s:.1f} s"
            log(f"  seed {seed}: target {shown}, exit {found[-1].wall_s:.1f} s")
    return found


def fixed_cost(found: list[Breakdown]) -> float:
    """What a run costs whatever it trains (median): launch → first step, and last validation → exit."""
    return statistics.median((b.first_step_s or 0.0) + b.wall_s - b.last_validation_s for b in found)


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def render(found: list[Breakdown], threads: int, task: tuple[str, ...] = tta.TASK, target: float = tta.TARGET,
           metric: str = tta.METRIC, title: str = "a copy_fast run") -> str:
    seeds = ", ".join(str(b.seed) for b in found)
    wall = median([b.wall_s for b in found])
    lines = [
        f"## Where {title}'s time goes",
        "",
        f"`train.py {' '.join(task)} training.stop_at={target} threads={threads}` (time to accuracy's CLI "
        f"training), seeds {seeds}; wall seconds of each phase's own calls (`BREAKDOWN` in "
        "`benchmarks/run_breakdown.py`: the phases' functions wrapped as their modules are imported, a call inside "
        "another phase's counted once, in the phase listed first), medians over the seeds.",
        "",
        "| phase | seconds | share of the run |",
        "|---|---:|---:|",
    ]
    for label in [*(label for label, _ in BREAKDOWN), REST]:
        seconds = statistics.median(b.own_s[label] for b in found)
        lines.append(f"| {label} | {seconds:.2f} | {seconds / wall:.0%} |")
    reached, first = median([b.target_s for b in found]), median([b.first_step_s for b in found])
    training = statistics.median(b.own_s[TRAINING] for b in found)
    lines += [
        f"| **launch to exit** | **{wall:.2f}** | 100% |",
        "",
        f"- launch to the first validation with `{metric}` ≥ {target:g}: "
        + ("not reached" if reached is None else f"**{reached:.1f} s**")
        + "; launch to the first training step (the run's `attnseq.first_step_s`): "
        + ("not recorded" if first is None else f"{first:.2f} s")
        + f"; validations: {statistics.median(b.validations for b in found):.0f}.",
        f"- not training (every row but the training steps): {wall - training:.1f} s of {wall:.1f} s "
        f"({(wall - training) / wall:.0%}).",
        f"- fixed cost (launch to the first step, and the last validation to the exit: the final heatmaps, "
        f"checkpoints and MLflow model): {fixed_cost(found):.1f} s.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget", type=float, default=240.0, help="seconds per training before it is stopped")
    parser.add_argument("--joey", action="store_true",
                        help=f"JoeyNMT's reverse task instead, to {tta.JOEY_METRIC} ≥ {tta.JOEY_TARGET:g}")
    args = parser.parse_args(argv)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    seeds = list(range(args.seeds))
    if args.joey:
        found = measure(seeds, args.threads, args.budget, tta.JOEY_TASK, tta.JOEY_TARGET, tta.JOEY_METRIC, log=log)
        print(render(found, args.threads, tta.JOEY_TASK, tta.JOEY_TARGET, tta.JOEY_METRIC, "a joey_reverse run"))
    else:
        print(render(measure(seeds, args.threads, args.budget, log=log), args.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
