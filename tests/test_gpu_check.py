"""benchmarks/gpu_check.py's dry run (CPU, tiny sizes) through its own ``main``: a row per
registered scorer × decoder family and per encoder, each passing, and a failure when a tolerance
cannot be met."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmark_scripts import imported  # tests/ on sys.path

from attnseq.attention import NO_ATTENTION, SCORERS

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_check():
    with imported("gpu_check") as module:
        yield module


def rows(text: str) -> dict[str, list[str]]:
    lines = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| ") and "/" in line.split("|")[1]]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in lines if "encoder" not in cells[0]}


def test_the_dry_run_checks_every_scorer_and_decoder(gpu_check, tmp_path, monkeypatch):
    out = tmp_path / "table.md"
    trained, real = [], gpu_check.training_run
    monkeypatch.setattr(gpu_check, "training_run", lambda *a, **k: trained.append(real(*a, **k)) or trained[-1])
    assert gpu_check.main(["--dry-run", "--out", str(out)]) == 0
    table = rows(out.read_text())
    decoders = {"bahdanau", "luong", "luong-nofeed", "transformer"}  # the registered conventions' cases
    assert set(gpu_check.DECODERS) == decoders
    pairs = {tuple(name.split("/")[1:]) for name in table}
    assert pairs == {(s, d) for s in SCORERS for d in decoders} | {(NO_ATTENTION, "bahdanau")}
    conf_encoders = {p.stem for p in (REPO / "conf" / "encoder").glob("*.yaml")}
    assert {name.split("/")[0] for name in table} == conf_encoders
    assert all(cells[-1] == "pass" for cells in table.values())
    assert all(float(cells[1]) <= 0.01 for cells in table.values())  # Δloss rel within the stated tolerance
    assert trained == [[]]  # the one train.py trainer=gpu ran and left one FINISHED bf16-mixed run
    for name, cells in table.items():  # CPU autocast takes none of attnseq's kernels (each runs outside autocast)
        assert cells[-3] == "—", name


def test_an_impossible_tolerance_fails(gpu_check, capsys):
    assert gpu_check.main(["--dry-run", "--no-train", "--cases", "gru/additive/bahdanau", "--loss-rtol", "0"]) == 1
    assert "gru/additive/bahdanau" in capsys.readouterr().err


def test_the_kernel_rules_on_cuda(gpu_check):
    assert gpu_check.kernel_problems("cuda", "fp32", ["GRUSequence"], 0, True, True)
    assert gpu_check.kernel_problems("cuda", "bf16", [], 1, True, False)
    assert gpu_check.kernel_problems("cpu", "bf16", ["AdditiveScores"], 0, True, True)
    assert not gpu_check.kernel_problems("cuda", "fp32", ["AdditiveScores"], 1, True, True)
