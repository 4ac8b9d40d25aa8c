"""The parts of the full benchmark that measure what a user waits on outside the training step, and the
peers beside it — time to accuracy, where a run's time goes, JoeyNMT's own task beside JoeyNMT, OpenNMT-py
beside attnseq, start-up, evaluation, a remote tracking server — each by its own module, run in this order
after the training tables. Each section returns its Markdown and its lines for the report's targets.

    .venv/bin/python benchmarks/bench.py --sections startup,evaluation   # these only, after the training tables
"""

from __future__ import annotations

import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

Log = Callable[[str], None]
TEXTBOOK_GOAL = 0.5  # issue 28: copy_fast's launch to 95% exact match at most this × the textbook loop's
FIRST_STEP_GOAL_S = 3.0  # issue 28: launch to the first training step
DECODING_GOALS = {1: 5.0, 5: 3.0}  # issue 28: evaluate.py against the previous loop, by beam size


@dataclass
class Waited:
    markdown: str
    targets: list[str]  # Markdown list items, each with its goal and whether it was met


def verdict(value: float, goal: float, unit: str, at_most: bool = True) -> str:
    met = value <= goal if at_most else value >= goal
    return f"**{value:.2f}{unit}** (goal {'≤' if at_most else '≥'} {goal:g}{unit}): {'met' if met else 'NOT met'}"


def time_to_accuracy(threads: int, log: Log) -> Waited:
    import time_to_accuracy as tta

    settings = tta.Settings(seeds=[0, 1, 2], target=tta.TARGET, budget_s=240.0, threads=threads, task=tta.TASK,
                            variants=tta.BATCHINGS)  # time to the target beside tokens/s: what a batching buys
    attempts = tta.measure(settings, log=log)
    median = {who: tta.median_seconds([a for a in attempts if a.who == who]) for who in {a.who for a in attempts}}
    cli, textbook = median["cli"], median["textbook"]
    shown = "not reached" if textbook is None else f"{textbook:.0f} s"
    target = (
        f"- time to {settings.target} validation exact match through the CLI, median of 3 seeds (textbook: {shown}): "
        + ("not reached within the budget: NOT met" if cli is None else verdict(cli, 100.0, " s"))
    )
    versus = ("not reached by both: NOT met" if cli is None or textbook is None
              else verdict(cli / textbook, TEXTBOOK_GOAL, "×"))
    batchings = ", ".join(f"{who.removeprefix('cli, ')} " + ("not reached" if median[who] is None
                                                              else f"{median[who]:.0f} s") for who in settings.variants)
    return Waited(tta.render(settings, attempts), [
        target, f"- the same, CLI / textbook (issue 28: launch to the target at most half the textbook's): {versus}",
        f"- the same with other training batches: {batchings}"])


def run_breakdown(threads: int, log: Log) -> Waited:
    import run_breakdown as module

    found = module.measure([0, 1, 2], threads, log=log)
    wall = statistics.median(b.wall_s for b in found)
    training = statistics.median(b.own_s[module.TRAINING] for b in found)
    target = (f"- a copy_fast run, launch to exit, median of 3 seeds: {wall:.1f} s, of which not training "
              f"{wall - training:.1f} s ({(wall - training) / wall:.0%}; 'Where a copy_fast run's time goes')")
    first = module.median([b.first_step_s for b in found])
    start = ("- the same runs, launch to the first training step (issue 28): "
             + ("not recorded: NOT met" if first is None else verdict(first, FIRST_STEP_GOAL_S, " s")))
    return Waited(module.render(found, threads), [target, start])


def joeynmt(threads: int, log: Log) -> Waited:
    """JoeyNMT's reverse task, attnseq then JoeyNMT 2.3.0 (installed in a venv of its own on first use), seed
    by seed, 3 seeds, each seed's two models then decoding the test split: about 14 minutes on 2 cores, two
    thirds of it JoeyNMT's."""
    import joeynmt_reverse as module

    python = module.joeynmt_python(None, log)
    with tempfile.TemporaryDirectory(prefix="joeynmt-reverse-") as workdir:
        runs, counts = module.measure([0, 1, 2], module.FULL, threads, 1500.0, python, Path(workdir), module.TARGETS,
                                      log)
    target = max(module.TARGETS)
    ours, theirs = module.medians(runs, target)
    missing = [who for who, seconds in (("attnseq", ours), (module.JOEY, theirs)) if seconds is None]
    reached = (f"not reached by {' and '.join(missing)}: NOT met" if missing
               else verdict(ours / theirs, module.GOAL, "×"))
    line = (f"- JoeyNMT's reverse task, launch to dev BLEU {target:g}, attnseq / {module.JOEY} on the same data and "
            f"machine, median of 3 seeds: {reached}")
    decodings = [f"- decoding JoeyNMT's test split ({counts['test']:,} sources), {row.label}, {module.JOEY}'s seconds "
                 f"over attnseq's: **{row.speedup:.2f}×** the translation alone, {row.speedup_from_launch:.2f}× from "
                 f"launch to exit; test BLEU {row.bleu[0]:.2f} / {row.bleu[1]:.2f} (measured)"
                 for row in module.decoding_rows(runs)]
    table = module.render(runs, module.TARGETS, "python benchmarks/joeynmt_reverse.py --seeds 3", counts)
    return Waited(f"## JoeyNMT's own task beside {module.JOEY}\n\n{table}", [line, *decodings])


def opennmt(threads: int, log: Log) -> Waited:
    """OpenNMT-py 3.5.1 beside attnseq (installed in a venv of its own on first use): the same GRU models trained
    and decoded by each, 3 repeats alternating: about 25 minutes on 2 cores."""
    import opennmt_peer as module

    bin_dir = module.onmt_bin(None, log)
    with tempfile.TemporaryDirectory(prefix="opennmt-peer-") as workdir:
        results = module.measure(module.FULL, threads, bin_dir, Path(workdir), log)
    table = module.render(results, module.FULL, threads, "python benchmarks/opennmt_peer.py")
    return Waited(f"## {module.PEER} beside attnseq\n\n{table}", module.targets(results, module.FULL))


def startup(threads: int, log: Log) -> Waited:
    import startup as module

    results = module.measure(tries=3, log=log)
    goals = module.GOALS_S
    medians = {
        "help": statistics.median(results["help"]),
        "first_step": statistics.median(results["first_step"]),
        "ui": statistics.median(results["ui"]["make ui"]),
    }
    texts = {
        "help": "`train.py --help`",
        "first_step": "first training step after launch (an existing store)",
        "ui": "`make ui` answers",
    }
    launches = module.measure_launch_cost(tries=3, log=log)  # a tiny run's CPU, and where it goes
    exits = module.measure_exits(tries=3, log=log)  # each entry point: its last line, then its exit
    markdown = (module.render(results) + "\n" + module.render_launch_cost(launches) + "\n"
                + module.render_exits(exits))
    tails = ", ".join(f"`{command}` {statistics.median(b - a for a, b in by_who['this']):.2f} s"
                      for command, by_who in exits["seconds"].items())
    return Waited(markdown, [*(f"- {texts[k]}: {verdict(v, goals[k], ' s')}" for k, v in medians.items()),
                             f"- each command's exit, from its last line to the process gone: {tails} (measured)"])


def evaluation(threads: int, log: Log) -> Waited:
    import evaluation_speed
    import teacher_forcing_speed

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # evaluate.py's default
    try:
        speed = evaluation_speed.measure(evaluation_speed.seeded_copy_run(), size=2000, repeats=2, log=log)
        passes = teacher_forcing_speed.measure(size=1000, repeats=3, log=log)  # validation's and evaluation's passes
    finally:
        torch.set_num_threads(before)
    targets = [
        f"- evaluation throughput ({'greedy' if k == 1 else f'beam {k}'}, with the counterfactual) vs the previous "
        f"loop: {verdict(speed.ratio(k), DECODING_GOALS[k], '×', at_most=False)} — at most {speed.bound(k):.2f}× while "
        "decoding alone costs what it does"
        for k in evaluation_speed.BEAM_SIZES
    ]
    gains = sorted(teacher_forcing_speed.pass_speedups(passes))
    if gains:
        targets.append(f"- the teacher-forced pass outside autograd, through the fused decoding step against the pass "
                       f"it replaced, {len(gains)} cases: median **{statistics.median(gains):.2f}×** (range "
                       f"{gains[0]:.2f}–{gains[-1]:.2f}×; measured)")
    tables = evaluation_speed.render(speed) + "\n" + teacher_forcing_speed.render(passes, 1000, 3, threads=1)
    return Waited(tables, targets)


def remote_tracking(threads: int, log: Log) -> Waited:
    import remote_tracking as module

    settings = module.Settings(train_size=12800, epochs=1, repeats=2, threads=threads)
    results = module.measure(settings, log=log)
    rows = module.summary(results)
    sync, asynchronous = rows["server sync"]["cost"], rows["server async"]["cost"]
    target = (
        f"- a run logging to `mlflow server` vs SQLite, whole run: {sync:+.1%} waiting for every call, "
        f"{asynchronous:+.1%} with asynchronous logging (attnseq's default for a server; goal: measured, and "
        "asynchronous past +3%): " + ("async needed and on" if sync > 0.03 else "within 3% even waited")
    )
    stalled = module.backlog(log=log)
    largest = stalled["rows"][-1]
    backlog = (f"- a stalled server's backlog of {largest['records']:,} records stored and the run FINISHED "
               f"{largest['seconds']:.2f} s after it answers again, in {largest['calls']:.0f} calls (measured)")
    return Waited(module.render(results) + "\n" + module.render_backlog(stalled), [target, backlog])


SECTIONS: dict[str, Callable[[int, Log], Waited]] = {
    "time-to-accuracy": time_to_accuracy,
    "run-breakdown": run_breakdown,
    "joeynmt": joeynmt,
    "opennmt": opennmt,
    "startup": startup,
    "evaluation": evaluation,
    "remote-tracking": remote_tracking,
}
"""Every section of the full run, in the order it runs them."""


def run_sections(names: list[str], threads: int, log: Log) -> dict[str, Waited]:
    """Each section in turn. One that fails is reported as failed, with its error, and the others still run:
    an hour's full run is not lost to its last section."""
    waited = {}
    for name in names:
        began = time.perf_counter()
        log(f"== {name}")
        try:
            waited[name] = SECTIONS[name](threads, log)
        except Exception as error:  # noqa: BLE001 — any failure of one section is reported, not raised
            log("".join(traceback.format_exception(error)))
            waited[name] = failed(name, error)
        log(f"== {name}: {time.perf_counter() - began:.0f} s")
    return waited


def failed(name: str, error: BaseException) -> Waited:
    """The report's entry for a section that raised ``error``."""
    said = f"{type(error).__name__}: {error}".splitlines()[0]
    return Waited(f"## {name}: failed\n\nThe section raised `{said}` (its traceback is in the run's log).\n",
                  [f"- {name}: **not measured**: the section failed (`{said}`)"])
