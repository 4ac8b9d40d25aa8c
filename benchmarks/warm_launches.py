"""The CPU a test's CLI launch costs from the warm interpreter (``tests/zygote.py``) and from a fresh one.

Alternates the same tiny training (``tests/cli_helpers.tiny``, 1 epoch, into a store that has its
schema) through ``run_cli`` warm and ``run_cli(fresh=True)``, ``--tries`` pairs, and prints the medians
of each launch's own CPU seconds (user + system: what the server's ``wait4`` reports for a warm launch,
``RUSAGE_CHILDREN`` for a fresh one) and wall seconds, with their ratio.

    .venv/bin/python benchmarks/warm_launches.py --tries 5
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import cli_helpers  # noqa: E402


def launch(root: Path, fresh: bool) -> tuple[float, float]:
    """One tiny training: (its CPU seconds, its wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = cli_helpers.run_cli(root, *cli_helpers.tiny(1), *cli_helpers.outputs_under(root, seeded=True), fresh=fresh)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(cli_helpers.explain(proc))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) if fresh else proc.cpu_s
    return cpu, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tries", type=int, default=3)
    args = parser.parse_args(argv)
    started = time.monotonic()
    if cli_helpers._warm_interpreter() is None:
        raise SystemExit("the warm interpreter did not start (ATTNSEQ_TESTS_FRESH=1 set?)")
    print(f"warm interpreter started in {time.monotonic() - started:.1f} s (wall, once per test process)")
    results: dict[str, list[tuple[float, float]]] = {"warm": [], "fresh": []}
    with tempfile.TemporaryDirectory(prefix="attnseq-warm-") as folder:
        for i in range(args.tries):
            for kind in ("warm", "fresh") if i % 2 == 0 else ("fresh", "warm"):
                results[kind].append(launch(Path(folder) / f"{kind}{i}", fresh=kind == "fresh"))
                print(f"  {kind}: {results[kind][-1][0]:.2f} s CPU, {results[kind][-1][1]:.1f} s wall", flush=True)
    cpu = {kind: statistics.median(c for c, _ in runs) for kind, runs in results.items()}
    wall = {kind: statistics.median(w for _, w in runs) for kind, runs in results.items()}
    print(f"\n| per launch (median of {args.tries}) | warm | fresh | ratio |\n|---|---:|---:|---:|")
    print(f"| CPU s | {cpu['warm']:.2f} | {cpu['fresh']:.2f} | {cpu['warm'] / cpu['fresh']:.2f}× |")
    print(f"| wall s | {wall['warm']:.1f} | {wall['fresh']:.1f} | {wall['warm'] / wall['fresh']:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
