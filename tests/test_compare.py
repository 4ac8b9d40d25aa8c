"""The side-by-side comparison on hand-built runs and results: runs that differ only in seed form
one group, its mean and 95% t interval equal a computation written out here, one seed shows no
interval anywhere, empty buckets are skipped, and the figures draw one band per multi-seed group."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba
from mlflow.entities import Metric, Param, Run, RunData, RunInfo, RunTag
from mlflow.tracking import MlflowClient

from attnseq.evaluation.compare import (
    Interval,
    differing_params,
    group_runs,
    mean_interval,
    metric_label,
    run_label,
    table_rows,
    write_comparison,
)
from attnseq.evaluation.evaluator import EvalResult
from attnseq.evaluation.pipeline import GROUPS_PARAM, log_comparison
from attnseq.evaluation.trained_runs import TrainedRun
from attnseq.metrics.declarations import METRICS, MetricDeclaration, SuiteSpec, names
from attnseq.metrics.faithfulness import FaithRecords, step_agreement
from attnseq.tracking import tags
from attnseq.tracking.client import TrackingClient
from attnseq.tracking.plots import accuracy_vs_length, metrics_vs_length
from attnseq.tracking.store import ensure_experiment

T_975_DF2 = 4.302652729911275
"""Student t quantile t_{0.975, 2} (tables): three seeds."""
T_975_DF1 = 12.706204736174698
"""Student t quantile t_{0.975, 1}: two values."""
MINUTE_MS = 60_000
CHOICES = "copy-gru-dot-bahdanau-h1"


class CountedModel:
    """Stands in for the model: the comparison only asks for its size."""

    def num_parameters(self) -> int:
        return 1234


def trained(run_id: str, seed: int, scorer: str = "dot", minutes: float = 2.0, best: float = 0.9,
            experiment_id: str = "0", **extra: str) -> TrainedRun:
    params = {"scorer.name": scorer, "seed": str(seed), "encoder.name": "gru", "model.heads": "1",
              "paths.output_dir": f"/tmp/{run_id}", **extra}  # the output folder differs per run: ignored
    info = RunInfo(run_id=run_id, experiment_id=experiment_id, user_id="me", status="FINISHED", start_time=0,
                   end_time=int(minutes * MINUTE_MS), lifecycle_stage="active", run_name=f"run {run_id}")
    data = RunData(metrics=[Metric("val/acc_best", best, 0, 0)], params=[Param(k, v) for k, v in params.items()],
                   tags=[RunTag(tags.CHOICES, CHOICES if scorer == "dot" else f"copy-gru-{scorer}")])
    config = {"scorer": {"name": scorer}, "encoder": {"name": "gru"}, "decoder": {"convention": "bahdanau"},
              "model": {"heads": 1}, "dataset": {"task": "copy", "train_lengths": [1, 6]}, "seed": seed}
    return TrainedRun(Run(info, data), config, src_vocab=None, tgt_vocab=None, model=CountedModel())


def bucket(lo: int, hi: int, acc: float | None, **columns) -> dict:
    return {"bucket": f"{lo:02d}-{hi:02d}", "lo": lo, "hi": hi, "sequences": 0 if acc is None else 10,
            "tokens": 0 if acc is None else 50, "acc": acc, "exact_match": None if acc is None else acc / 2,
            **columns}


def result(acc: float, rows: list[dict], **metrics: float) -> EvalResult:
    return EvalResult({"eval/acc": acc, "eval/exact_match": acc / 2, "eval/acc_len/01-05": rows[0]["acc"],
                       **metrics}, rows)


def three_seeds(experiment_id: str = "0") -> tuple[list[TrainedRun], list[EvalResult]]:
    """Same config, seeds 0, 1, 2; the 11-14 bucket is empty for seed 0 and for every seed at 15-16."""
    runs = [trained(f"r{seed}", seed, minutes=minutes, experiment_id=experiment_id)
            for seed, minutes in ((0, 2.0), (1, 3.0), (2, 4.0))]
    results = [
        result(0.80, [bucket(1, 5, 0.90), bucket(6, 10, 0.60), bucket(11, 14, None), bucket(15, 16, None)]),
        result(0.84, [bucket(1, 5, 0.94), bucket(6, 10, 0.60), bucket(11, 14, 0.50), bucket(15, 16, None)]),
        result(0.86, [bucket(1, 5, 0.95), bucket(6, 10, 0.60), bucket(11, 14, 0.70), bucket(15, 16, None)]),
    ]
    return runs, results


def read_csv(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


# -- the interval ----------------------------------------------------------------------------
def test_the_interval_is_the_student_t_interval_of_the_mean():
    # 0.90, 0.94, 0.95: mean 0.93; squared deviations 0.0009 + 0.0001 + 0.0004 = 0.0014 over n - 1 = 2
    interval = mean_interval([0.90, 0.94, 0.95])
    assert interval.n == 3
    assert interval.mean == pytest.approx(0.93)
    assert interval.half_width == pytest.approx(T_975_DF2 * math.sqrt(0.0014 / 2) / math.sqrt(3))


def test_missing_values_are_skipped_not_counted_as_zero():
    # 0.5 and 0.7: mean 0.6, s = √(0.01 + 0.01) = √0.02
    interval = mean_interval([None, 0.5, float("nan"), 0.7])
    assert interval.n == 2 and interval.mean == pytest.approx(0.6)
    assert interval.half_width == pytest.approx(T_975_DF1 * math.sqrt(0.02) / math.sqrt(2))
    assert mean_interval([None, float("nan")]) is None


def test_one_value_has_no_interval():
    interval = mean_interval([0.7])
    assert interval == Interval(0.7, None, 1)
    assert interval.format() == "0.700"


# -- grouping --------------------------------------------------------------------------------
def test_runs_differing_only_in_seed_are_one_group_with_mean_and_interval():
    [group] = group_runs(*three_seeds())
    assert group.name == f"{CHOICES} (3 seeds)" and group.seeds == ["0", "1", "2"]
    first = group.buckets()[0]
    assert (first["lo"], first["hi"]) == (1, 5)
    assert first["acc"].mean == pytest.approx(0.93)
    assert first["acc"].half_width == pytest.approx(T_975_DF2 * math.sqrt(0.0014 / 2) / math.sqrt(3))
    overall = group.overall()
    # minutes 2, 3, 4: mean 3, s = 1
    assert overall["train_min"].mean == pytest.approx(3.0)
    assert overall["train_min"].half_width == pytest.approx(T_975_DF2 / math.sqrt(3))
    # eval/acc 0.80, 0.84, 0.86: mean 0.8333…, squared deviations (0.0011…², …) summed by hand: 0.001866…
    mean = (0.80 + 0.84 + 0.86) / 3
    assert overall["eval/acc"].mean == pytest.approx(mean)
    squares = (0.80 - mean) ** 2 + (0.84 - mean) ** 2 + (0.86 - mean) ** 2
    assert overall["eval/acc"].half_width == pytest.approx(T_975_DF2 * math.sqrt(squares / 2) / math.sqrt(3))
    assert overall["val/acc_best"].half_width == pytest.approx(0.0)  # the same 0.9 each time: a real zero
    assert "eval/acc_len/01-05" not in overall  # a per-bucket metric: it is in the bucket rows


def test_runs_differing_in_scorer_and_seed_are_grouped_per_scorer():
    runs = [trained(f"d{s}", s) for s in range(3)]
    runs += [trained(f"a{s}", s, scorer="additive", **{"scorer.attn_dim": "32"}) for s in range(2)]
    results = [result(0.8 + s / 100, [bucket(1, 5, 0.9 + s / 100)]) for s in (0, 1, 2, 0, 1)]
    groups = group_runs(runs, results)
    assert [g.name for g in groups] == ["scorer=dot (3 seeds)", "scorer=additive (2 seeds)"]
    assert [g.label for g in groups] == ["scorer=dot", "scorer=additive"]  # no attn_dim: only additive has it
    assert [[m.trained.run_id for m in g.members] for g in groups] == [["d0", "d1", "d2"], ["a0", "a1"]]
    # additive: 0.90, 0.91 → mean 0.905, s = √(2 · 0.005²) = 0.005√2
    additive = groups[1].buckets()[0]["acc"]
    assert additive.mean == pytest.approx(0.905)
    assert additive.half_width == pytest.approx(T_975_DF1 * 0.005 * math.sqrt(2) / math.sqrt(2))


def test_runs_differing_in_anything_else_stay_apart():
    runs = [trained("h1s0", 0), trained("h1s1", 1), trained("h4s0", 0, **{"model.heads": "4"})]
    results = [result(0.8, [bucket(1, 5, 0.9)])] * 3
    groups = group_runs(runs, results)
    assert [g.name for g in groups] == ["model.heads=1 (2 seeds)", "model.heads=4"]


# -- tables and files ------------------------------------------------------------------------
def test_tables_show_mean_and_interval_and_the_csvs_hide_nothing(tmp_path):
    groups = group_runs(*three_seeds())
    header, [row] = table_rows(groups)
    cells = dict(zip(header, row))
    assert cells["group"] == f"{CHOICES} (3 seeds)" and cells["seeds"] == "3"
    half = T_975_DF2 * math.sqrt(0.0014 / 2) / math.sqrt(3)
    assert cells["acc 01-05"] == f"0.930 ± {half:.3f}"
    assert cells["acc 06-10"] == "0.600 ± 0.000"  # three equal values: the spread is really zero
    assert cells["acc 11-14"] == f"0.600 ± {T_975_DF1 * math.sqrt(0.02) / math.sqrt(2):.3f}"  # seed 0 empty
    assert cells["acc 15-16"] == "-"  # empty for every seed
    assert cells["train min"] == f"3.0 ± {T_975_DF2 / math.sqrt(3):.1f}"

    written = write_comparison(groups, tmp_path, "test")
    [summary] = read_csv(written["csv"])
    assert summary["group"] == CHOICES and summary["n_seeds"] == "3" and summary["seeds"] == "0 1 2"
    assert float(summary["acc/01-05_mean"]) == pytest.approx(0.93)
    assert float(summary["acc/01-05_ci95"]) == pytest.approx(half)
    assert float(summary["eval/acc_mean"]) == pytest.approx((0.80 + 0.84 + 0.86) / 3)
    assert summary["acc/15-16_mean"] == summary["acc/15-16_ci95"] == ""
    per_run = read_csv(written["runs_csv"])
    assert [(r["run_id"], r["seed"], r["acc/01-05"]) for r in per_run] == [
        ("r0", "0", "0.9"), ("r1", "1", "0.94"), ("r2", "2", "0.95")
    ]
    assert per_run[0]["acc/11-14"] == ""  # seed 0's empty bucket stays empty
    assert {"comparison.md", "comparison.csv", "comparison_runs.csv", "comparison.png"} <= {
        p.name for p in written.values()
    }
    assert "diagnostics" not in " ".join(written)  # no attention diagnostics in these results


def test_text_scores_join_the_table_only_when_the_runs_have_them():
    rows = [bucket(1, 5, 0.9), bucket(6, 10, 0.7)]
    symbols = group_runs([trained("d", 0), trained("a", 0, scorer="additive")], [result(0.8, rows), result(0.7, rows)])
    header, _ = table_rows(symbols)
    assert "sacreBLEU" not in header and "chrF" not in header and "TER" not in header
    runs = [trained(f"r{seed}", seed) for seed in (0, 1)]
    text = group_runs(runs, [result(0.8, rows, **{"eval/sacrebleu": 20.0, "eval/chrf": 40.0, "eval/ter": 60.0}),
                             result(0.8, rows, **{"eval/sacrebleu": 24.0, "eval/chrf": 44.0, "eval/ter": 64.0})])
    header, [row] = table_rows(text)
    cells = dict(zip(header, row))
    half = T_975_DF1 * math.sqrt(8.0) / math.sqrt(2)  # two values 4 apart: s = √8
    assert cells["sacreBLEU"] == f"22.0 ± {half:.1f}" and cells["chrF"] == f"42.0 ± {half:.1f}"
    assert cells["TER"] == f"62.0 ± {half:.1f}"
    assert header.index("chrF") == header.index("sacreBLEU") + 1 == header.index("TER") - 1 < header.index("acc 01-05")


def test_one_seed_shows_no_interval_anywhere(tmp_path):
    runs = [trained("d", 0), trained("a", 0, scorer="additive")]
    rows = [bucket(1, 5, 0.9, attn_entropy=0.5, attn_margin=0.4), bucket(6, 10, 0.7, attn_entropy=1.0,
                                                                          attn_margin=0.1)]
    groups = group_runs(runs, [result(0.8, rows), result(0.7, rows)])
    assert [g.name for g in groups] == ["scorer=dot", "scorer=additive"]
    _, table = table_rows(groups)
    assert not any("±" in cell for row in table for cell in row)
    written = write_comparison(groups, tmp_path, "test")
    for name in ("markdown", "diagnostics_markdown"):
        assert "± 0.000" not in written[name].read_text()
    for row in read_csv(written["csv"]) + read_csv(written["diagnostics_csv"]):
        assert all(value == "" for key, value in row.items() if key.endswith("_ci95"))
    figure = accuracy_vs_length({g.name: g.curve_rows() for g in groups}, (1, 6), "one seed",
                                metric="acc_mean", half_width="acc_ci95")
    assert not [c for c in figure.axes[0].collections if isinstance(c, PolyCollection)]


def test_the_diagnostics_table_lists_attending_groups_per_bucket(tmp_path):
    runs = [trained(f"d{s}", s) for s in range(2)] + [trained("n0", 0, scorer="none")]
    dot_rows = [
        [bucket(1, 5, 0.9, attn_entropy=0.2, attn_margin=0.7, align_acc=0.9, align_acc_near=1.0, align_offset=1.0)],
        [bucket(1, 5, 0.9, attn_entropy=0.4, attn_margin=0.5, align_acc=0.7, align_acc_near=1.0, align_offset=1.0)],
    ]
    results = [result(0.9, r, **{"eval/attn_entropy": 0.3 + i / 10}) for i, r in enumerate(dot_rows)]
    results.append(result(0.5, [bucket(1, 5, 0.6)]))
    written = write_comparison(group_runs(runs, results), tmp_path, "test")
    rows = read_csv(written["diagnostics_csv"])
    assert [(r["group"], r["bucket"]) for r in rows] == [("scorer=dot", "01-05"), ("scorer=dot", "all")]
    first, whole = rows
    assert float(first["attn_entropy_mean"]) == pytest.approx(0.3)  # (0.2 + 0.4) / 2
    assert float(first["attn_entropy_ci95"]) == pytest.approx(T_975_DF1 * math.sqrt(0.02) / math.sqrt(2))
    assert float(first["align_offset_mean"]) == 1.0 and float(first["align_acc_near_ci95"]) == 0.0
    assert float(whole["attn_entropy_mean"]) == pytest.approx(0.35)  # eval/attn_entropy 0.3, 0.4
    assert whole["attn_margin_mean"] == ""  # no overall margin was logged
    assert "scorer=none" not in written["diagnostics_markdown"].read_text()
    assert written["diagnostics_figure"].read_bytes()[:4] == b"\x89PNG"


# -- the faithfulness columns ------------------------------------------------------------------
FAITH_SPEC = SuiteSpec("eval", max_length=10, bucket_width=5, train_lengths=(1, 6), attention=True,
                       gold_alignment=True, text=False, faith=("grad_x_input", "counterfactual", "adversarial"))


def faith_metrics(shift: float) -> dict[str, float]:
    """``eval/faith/...`` as the registry's faithfulness metric computes them from a probe's records: two steps,
    of sources of 3 and 7 tokens (buckets 01-05 and 06-10); the permuted attention replayed on the second only."""
    records = FaithRecords(
        agreements=[(3, {"grad_x_input": step_agreement(np.array([[0.7, 0.2, 0.1]]), np.array([3.0, 1.0, 2.0]))}),
                    (7, {"grad_x_input": step_agreement(np.array([[0.1, 0.3, 0.6]]), np.array([1.0, 2.0, 3.0]))})],
        flips=[("uniform", 3, 4, 1), ("uniform", 7, 4, 2), ("permute", 7, 5, 2)],
        jsd=[(3, 0.1 + shift), (7, 0.3 + shift)],
    )
    member = METRICS["faithfulness"](FAITH_SPEC)
    member.add(records)
    return {f"eval/{name}": float(value) for name, value in member.compute().items()}


def test_comparison_csv_has_the_faithfulness_columns_the_metric_registry_declares(tmp_path):
    """Every ``eval/faith/...`` name the registry's faithfulness metrics declare for the evaluation, overall and
    per bucket, a plugin's too, is a column (mean and interval), its values the seeds' own; none more."""

    class ProbeCost(MetricDeclaration):  # a plugin's faithfulness metric, declared only: the comparison reads names
        name = "faith_probe_cost"
        needs_attention = needs_faith = True
        stages = ("eval",)

        @classmethod
        def overall_names(cls, spec):
            return ["faith/probe_seconds"]

    try:
        declared = names(FAITH_SPEC, needs_faith=True)
        assert "eval/faith/probe_seconds" in declared and "eval/faith/adversarial_jsd_len/06-10" in declared
        rows = [bucket(1, 5, 0.9), bucket(6, 10, 0.7)]
        results = []
        for shift in (0.0, 0.1):
            metrics = faith_metrics(shift) | {"eval/faith/probe_seconds": 2.0 + shift}
            results.append(replace(result(0.8, rows, **metrics), spec=FAITH_SPEC))
        groups = group_runs([trained("r0", 0), trained("r1", 1)], results)
        written = write_comparison(groups, tmp_path, "faith")
        [row] = read_csv(written["csv"])
    finally:
        del METRICS["faith_probe_cost"]
    faith_columns = [column for column in row if column.startswith("eval/faith/")]
    assert sorted(faith_columns) == sorted(f"{name}{suffix}" for name in declared for suffix in ("_mean", "_ci95"))
    assert float(row["eval/faith/adversarial_jsd_mean"]) == pytest.approx((0.2 + 0.3) / 2)  # each run's 0.2, 0.3
    assert float(row["eval/faith/adversarial_jsd_len/01-05_mean"]) == pytest.approx((0.1 + 0.2) / 2)
    assert float(row["eval/faith/cf_uniform_flip_rate_mean"]) == pytest.approx(3 / 8)
    assert float(row["eval/faith/grad_x_input/tau_mean"]) == pytest.approx((1 / 3 + 1) / 2)  # τ by hand: 1/3 and 1
    assert row["eval/faith/cf_permute_flip_rate_len/01-05_mean"] == ""  # no permuted step there
    assert float(row["eval/faith/probe_seconds_mean"]) == pytest.approx(2.05)
    per_run = read_csv(written["runs_csv"])
    assert [float(r["eval/faith/adversarial_jsd"]) for r in per_run] == pytest.approx([0.2, 0.3])
    off = group_runs([trained("r0", 0)], [result(0.8, rows)])  # no spec (faith.samples=0 reports none): no column
    [row] = read_csv(write_comparison(off, tmp_path / "off", "off")["csv"])
    assert not [column for column in row if column.startswith("eval/faith/")]


# -- figures ---------------------------------------------------------------------------------
def bands(ax) -> list[PolyCollection]:
    return [c for c in ax.collections if isinstance(c, PolyCollection)]


def test_figures_draw_one_band_per_multi_seed_group_in_its_line_colour():
    runs = [trained(f"d{s}", s) for s in range(3)] + [trained(f"a{s}", s, scorer="additive") for s in range(2)]
    runs.append(trained("n0", 0, scorer="none"))
    results = [result(0.8, [bucket(1, 5, 0.9 - s / 50, attn_entropy=0.3 + s / 10, attn_margin=0.5),
                            bucket(6, 10, 0.5 + s / 50, attn_entropy=0.9, attn_margin=0.2 + s / 10)])
               for s in (0, 1, 2, 0, 1, 0)]
    groups = group_runs(runs, results)
    curves = {g.name: g.curve_rows() for g in groups}
    figure = accuracy_vs_length(curves, (1, 6), "bands", metric="acc_mean", half_width="acc_ci95")
    [ax] = figure.axes
    assert len(bands(ax)) == 2  # dot (3 seeds) and additive (2 seeds); the single-seed baseline has none
    lines = {line.get_label(): line.get_color() for line in ax.get_lines()}
    for band, group in zip(bands(ax), groups[:2]):
        assert to_rgba(band.get_facecolor()[0], 1.0) == to_rgba(lines[group.name], 1.0)
    panels = [("attn_entropy_mean", "attn_entropy_ci95", "entropy"), ("attn_margin_mean", "attn_margin_ci95", "margin")]
    figure = metrics_vs_length(curves, (1, 6), "diagnostics", panels)
    assert [len(bands(ax)) for ax in figure.axes] == [2, 2]


# -- the comparison run ----------------------------------------------------------------------
def test_the_comparison_run_logs_group_means_intervals_and_its_groups(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow puts a SQLite store's artifacts under ./mlruns
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    experiment_id = ensure_experiment(client, "compare")
    runs, results = three_seeds(experiment_id)
    runs.append(trained("a0", 0, scorer="additive", experiment_id=experiment_id))
    results.append(result(0.7, [bucket(1, 5, 0.8)]))
    run_id = log_comparison(TrackingClient(client.tracking_uri), group_runs(runs, results), tmp_path / "out",
                            parent=None)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params[GROUPS_PARAM] == "scorer=dot (3 seeds); scorer=additive"
    metrics = run.data.metrics
    mean = (0.80 + 0.84 + 0.86) / 3
    squares = (0.80 - mean) ** 2 + (0.84 - mean) ** 2 + (0.86 - mean) ** 2
    assert metrics["eval/acc/scorer_dot"] == pytest.approx(mean)
    assert metrics["eval/acc_ci95/scorer_dot"] == pytest.approx(T_975_DF2 * math.sqrt(squares / 2) / math.sqrt(3))
    assert metrics["eval/acc/scorer_additive"] == pytest.approx(0.7)
    assert "eval/acc_ci95/scorer_additive" not in metrics  # one seed: no interval
    logged = {info.path for info in client.list_artifacts(run_id, "comparison")}
    assert {"comparison/comparison.md", "comparison/comparison.csv", "comparison/comparison_runs.csv",
            "comparison/comparison.png"} <= logged
    assert metric_label("scorer=dot model.heads=4") == "scorer_dot model.heads_4"


def test_settings_an_option_brings_are_not_in_the_label():
    """``encoder=bigru`` says ``encoder.bidirectional=True``; a setting swept on its own stays."""
    def run(encoder, bidirectional, hidden):
        params = {"encoder.name": encoder, "encoder.bidirectional": bidirectional, "encoder.hidden": hidden,
                  "decoder.convention": "luong", "seed": "0"}
        return SimpleNamespace(data=SimpleNamespace(params=params, tags={}))

    runs = [run("gru", "False", "64"), run("bigru", "True", "64"), run("gru", "False", "128"),
            run("bigru", "True", "128")]
    keys = differing_params(runs)
    assert keys == ["encoder.hidden", "encoder.name"]
    assert run_label(runs[1], keys) == "encoder.hidden=64 encoder=bigru"
