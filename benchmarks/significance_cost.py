"""What a comparison's tables and significance cost on a symbol task: ``write_comparison`` then
``write_significance`` (what ``log_comparison`` writes before it uploads anything) on seeded outcomes shaped as
``evaluate_run`` makes them — ``--groups`` groups of ``--seeds`` seeds, ``--size`` test sequences per run of
lengths 1-30 over 50 symbols, each group its own error rate — with ``eval.bootstrap_samples`` resamples:

    .venv/bin/python benchmarks/significance_cost.py --task reverse --against /path/to/other/checkout
    .venv/bin/python benchmarks/significance_cost.py --task copy --against /path/to/other/checkout --repeats 5

``reverse`` is scored with sacreBLEU (its outcomes carry text, as ``evaluate_run`` makes them for a task that
``is_text``), ``copy`` is not. With ``--against``, the same measurement runs in a process of the other checkout
after each of this one's (alternating, ``--tries`` each); medians, and their ratio. Markdown on stdout."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve()
SYMBOLS = 50


class CountedModel:
    def num_parameters(self) -> int:
        return 1234


def run_outcomes(task: str, seed: int, size: int, error: float, rng):
    """One run's ``SequenceOutcomes``: the seed's test sequences (the same for every group), each output token
    wrong with probability ``error``; text (the tokens joined by spaces) where the task is scored as text."""
    import numpy as np

    from attnseq.data.tasks import TASKS, generate
    from attnseq.metrics.significance import SequenceOutcomes

    examples = generate(task, size, (1, 30), 1000 + seed, num_symbols=SYMBOLS)  # the seed's sequences
    targets = [np.array([int(token[1:]) for token in e.tgt]) for e in examples]
    outputs = [np.where(rng.random(len(t)) < error, (t + 1) % SYMBOLS, t) for t in targets]
    keys = tuple((tuple(e.src), tuple(e.tgt)) for e in examples)
    correct = np.array([int((o == t).sum()) + 1 for o, t in zip(outputs, targets)])  # + EOS, always right here
    tokens = np.array([len(t) + 1 for t in targets])
    if not TASKS.lookup(task).is_text:  # as evaluate_run: text outcomes where the suite scores text
        return SequenceOutcomes(keys, correct, tokens)
    text = tuple(" ".join(f"s{k}" for k in o) for o in outputs)
    return SequenceOutcomes(keys, correct, tokens, text, tuple(" ".join(e.tgt) for e in examples))


def seed_groups(task: str, groups: int, seeds: int, size: int):
    """``groups`` groups (``scorer=g<i>``) of ``seeds`` runs, as ``group_runs`` makes them."""
    import numpy as np

    from attnseq.evaluation.compare import Compared, SeedGroup
    from attnseq.evaluation.evaluator import EvalResult
    from attnseq.metrics.translation import corpus_scores

    rng = np.random.default_rng(0)
    found = []
    for g in range(groups):
        members = []
        for seed in range(seeds):
            outcomes = run_outcomes(task, seed, size, 0.05 + 0.1 * g, rng)
            metrics = {"eval/acc": outcomes.correct.sum() / outcomes.tokens.sum(),
                       "eval/exact_match": float(outcomes.exact.mean())}
            if outcomes.hypotheses is not None:
                metrics |= {f"eval/{k}": v for k, v in corpus_scores(outcomes.hypotheses, outcomes.references).items()}
            info = SimpleNamespace(run_id=f"g{g}s{seed}", run_name=f"g{g}s{seed}", start_time=0, end_time=60_000)
            run = SimpleNamespace(info=info, data=SimpleNamespace(params={"seed": str(seed)}, metrics={}))
            config = {"dataset": {"task": task, "train_lengths": [1, 25]}, "scorer": {"name": f"g{g}"},
                      "encoder": {"name": "gru"}, "decoder": {"convention": "bahdanau"}, "model": {"heads": 1}}
            trained = SimpleNamespace(run=run, config=config, model=CountedModel(), train_lengths=(1, 25),
                                      run_id=info.run_id, name=info.run_name)
            row = {"bucket": "01-30", "lo": 1, "hi": 30, "sequences": size, "acc": metrics["eval/acc"],
                   "exact_match": metrics["eval/exact_match"]}
            members.append(Compared(trained, EvalResult(metrics, [row], outcomes=outcomes)))
        found.append(SeedGroup(f"scorer=g{g}", members))
    return found


def measure(task: str, groups: int, seeds: int, size: int, samples: int, repeats: int) -> float:
    """Seconds of the comparison's tables and significance of those groups, each time in a fresh folder: the
    least of ``repeats`` after a warm-up of the tables alone (the first figure loads matplotlib's fonts)."""
    from attnseq.evaluation.compare import write_comparison
    from attnseq.evaluation.significance import write_significance

    made = seed_groups(task, groups, seeds, size)
    with tempfile.TemporaryDirectory() as folder:
        write_comparison(made, Path(folder) / "warm-up", "benchmark")
    found = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            write_comparison(made, Path(folder), "benchmark")
            write_significance(made, Path(folder), samples, 12345, "benchmark")
            found.append(time.perf_counter() - start)
    return min(found)


def one_try(checkout: Path, args: argparse.Namespace) -> float:
    """``measure`` in a fresh process of ``checkout``'s code."""
    env = os.environ | {"PYTHONPATH": str(checkout), "SACREBLEU_SEED": "12345"}
    command = [sys.executable, str(HERE), "--task", args.task, "--groups", str(args.groups), "--seeds",
               str(args.seeds), "--size", str(args.size), "--samples", str(args.samples), "--repeats",
               str(args.repeats), "--once"]
    out = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="reverse", help="a symbol task: reverse (scored with sacreBLEU), copy")
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--size", type=int, default=1000, help="test sequences per run")
    parser.add_argument("--samples", type=int, default=1000, help="eval.bootstrap_samples")
    parser.add_argument("--tries", type=int, default=3, help="processes per checkout")
    parser.add_argument("--repeats", type=int, default=1, help="measurements per process (the least is kept)")
    parser.add_argument("--against", type=Path, help="another checkout, measured alternately")
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.once:
        print(measure(args.task, args.groups, args.seeds, args.size, args.samples, args.repeats))
        return
    here = HERE.parent.parent
    times: dict[str, list[float]] = {"this checkout": [], "against": []}
    for _ in range(args.tries):
        times["this checkout"].append(one_try(here, args))
        if args.against is not None:
            times["against"].append(one_try(args.against, args))
    pairs = args.groups * (args.groups - 1) // 2
    print(f"{args.task}: {args.groups} groups × {args.seeds} seeds ({pairs} pairs), {args.size} sequences per run, "
          f"{args.samples} resamples; medians of {args.tries} processes, each the least of {args.repeats} after a "
          "warm-up\n")
    print("| write_comparison + write_significance | s (median) | × this checkout | each try, s |\n|---|---:|---:|---|")
    base = statistics.median(times["this checkout"])
    for name, found in times.items():
        if found:
            each = ", ".join(f"{t:.2f}" for t in found)
            print(f"| {name} | {statistics.median(found):.2f} | {statistics.median(found) / base:.2f}× | {each} |")


if __name__ == "__main__":
    main()
