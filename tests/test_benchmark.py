"""The benchmark's quick mode (benchmarks/bench.py --quick): every configuration trains through
both loops and the baseline, and the report has every row. The performance targets themselves
depend on the machine and are checked by the full run (benchmarks/results.md), not here."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("attnseq_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def quick(bench, tmp_path_factory):
    args = bench.argparse.Namespace(quick=True, device="cpu", threads=1, compile=False)
    settings = bench.make_settings(args)
    results = bench.run(settings, log=lambda line: None, workdir=tmp_path_factory.mktemp("bench"))
    return settings, results, bench.render(results, "python benchmarks/bench.py --quick")


def finite_positive(value) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def test_the_quick_cases_cover_every_scorer_decoder_and_encoder(bench):
    cases = bench.QUICK_CASES
    assert {c.scorer for c in cases} == {"additive", "dot", "general", "concat", "scaled_dot", "none"}
    assert {c.decoder for c in cases} == {"bahdanau", "luong", "luong-nofeed"}
    assert {c.encoder for c in cases} == {"gru", "lstm", "bigru"}


def test_every_case_trains_through_the_real_path_the_minimal_loop_and_the_baseline(quick):
    settings, results, _ = quick
    rows = results["rows"]
    for case in settings.cases:
        row = rows[case.name]
        assert len(row.rates["real"]) == settings.windows, case.name
        for loop in ("real", "minimal", "textbook"):
            assert finite_positive(row.median(loop)), (case.name, loop)
        assert row.activations > 0
    assert finite_positive(rows["textbook"].median("minimal"))
    assert finite_positive(rows["textbook"].median("random"))


def test_padding_and_decoding_are_measured(quick):
    _, results, _ = quick
    assert 0 <= results["padding"]["bucketed"] < results["padding"]["random"] < 1
    for entry in results["decoding"].values():
        assert finite_positive(entry["seq_s"]) and finite_positive(entry["tok_s"])


def test_the_report_has_every_row_and_every_target(quick):
    settings, _, report = quick
    training = report.split("## Training throughput")[1].split("## Padding")[0]
    table = [line for line in training.splitlines() if line.startswith("| ")]
    for case in settings.cases:
        (line,) = [row for row in table if row.startswith(f"| {case.name} |")]
        assert "—" not in line.split("|")[2:7], line  # real, ×base, minimal, ×base, overhead
    for heading in ("## Training throughput", "## Padding and length bucketing", "## Decoding", "## Targets"):
        assert heading in report
    targets = report.split("## Targets")[1]
    for goal in ("≥ 1.8×", "≥ 3×", "≤ 10%", "≥ 5×"):
        assert goal in targets
    assert "torch.get_num_threads() = " in report and "commit: " in report
