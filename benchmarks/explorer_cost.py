"""What the attention explorer's importance costs an evaluation: ``explorer_of`` (greedy decoding of
``eval.explorer_samples`` examples spread over the lengths, then gradient × input, integrated gradients and
leave-one-out for every step, ``conf/evaluate.yaml``'s ``faith`` settings) on the newest training run of a
store, e.g. the one ``make train`` fills:

    .venv/bin/python benchmarks/explorer_cost.py --store sqlite:///mlflow.db
    .venv/bin/python benchmarks/explorer_cost.py --store sqlite:///mlflow.db --against /path/to/other/checkout

With ``--against``, the same measurement runs in a process of the other checkout after each of this one's
(alternating, ``--tries`` each); medians, and their ratio. One torch thread. Markdown on stdout."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def measure(store: str, lengths: tuple[int, int]) -> float:
    """Seconds of one ``explorer_of`` on the store's newest training run (after a warm-up call)."""
    import torch

    from attnseq.evaluation.evaluator import EvalSettings, evaluation_examples, explorer_of
    from attnseq.evaluation.trained_runs import latest_training_run, load_trained_run
    from attnseq.tracking.client import TrackingClient

    torch.set_num_threads(1)
    client = TrackingClient(store)
    trained = load_trained_run(client, latest_training_run(client, None))
    settings = EvalSettings(lengths=lengths, bucket_width=5, size=200, seed=1)
    examples = evaluation_examples(trained, settings)
    explorer_of(trained, examples, settings)  # warm-up: first calls allocate
    start = time.perf_counter()
    explorer_of(trained, examples, settings)
    return time.perf_counter() - start


def one_try(checkout: Path, store: str, lengths: tuple[int, int]) -> float:
    """``measure`` in a fresh process of ``checkout``'s code."""
    env = os.environ | {"PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, str(HERE), "--store", store, "--lengths", *map(str, lengths), "--once"],
                         cwd=checkout, env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="an MLflow tracking URI with a finished training run")
    parser.add_argument("--lengths", nargs=2, type=int, default=(1, 30), help="the evaluated lengths")
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout, measured alternately")
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = tuple(args.lengths)
    if args.once:
        print(f"{measure(args.store, lengths):.4f}")
        return
    checkouts = {"this checkout": HERE.parents[1]} | ({"--against": args.against.resolve()} if args.against else {})
    seconds: dict[str, list[float]] = {name: [] for name in checkouts}
    for _ in range(args.tries):
        for name, checkout in checkouts.items():
            seconds[name].append(one_try(checkout, args.store, lengths))
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    print(f"| explorer_of, lengths {lengths[0]}-{lengths[1]} | s (median of {args.tries}) | × this checkout |")
    print("|---|---:|---:|")
    for name, median in medians.items():
        print(f"| {name} ({checkouts[name]}) | {median:.2f} | {median / medians['this checkout']:.2f}× |")


if __name__ == "__main__":
    main()
