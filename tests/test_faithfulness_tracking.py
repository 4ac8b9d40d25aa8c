"""Faithfulness over training and per length bucket (``faith.*``): the probe on a sample of sequences, through
the one metrics suite (``faith/...`` names, their summaries per bucket against a computation written here), and
one run through the real CLIs whose ``val/faith/*`` curves and ``eval/faith/..._len/<bucket>`` metrics land in
MLflow."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from cli_helpers import EVALUATE_PY, all_runs, explain, outputs_under, run_cli, tiny, tracking_uri  # noqa: E402
from scipy.stats import kendalltau

from attnseq.faithfulness.importance import step_importance
from attnseq.faithfulness.probe import probe, spread
from attnseq.metrics import MetricSuite, SuiteSpec, lower_is_better, names
from attnseq.metrics.faithfulness import FaithRecords, FaithSettings, step_agreement
from attnseq.model import ModelConfig, build_seq2seq

GROUPS = ("leave_one_out", "counterfactual", "adversarial")


def spec(stage: str, groups=GROUPS, attention: bool = True) -> SuiteSpec:
    return SuiteSpec(stage, max_length=8, bucket_width=4, train_lengths=(1, 4), attention=attention,
                     gold_alignment=False, text=False, faith=groups)


def test_the_suite_declares_the_faith_names_only_when_probed():
    val = names(spec("val"))
    assert {"val/faith/leave_one_out/tau", "val/faith/leave_one_out/significant", "val/faith/leave_one_out/top1",
            "val/faith/cf_permute_flip_rate", "val/faith/cf_uniform_flip_rate", "val/faith/adversarial_jsd"} <= set(val)
    assert not [n for n in val if "_len/" in n and "faith" in n]  # fit: overall only
    assert "eval/faith/leave_one_out/tau_len/05-08" in names(spec("eval"))
    assert not [n for n in names(spec("val", ())) + names(spec("val", attention=False)) if "faith" in n]
    assert lower_is_better("val/faith/adversarial_jsd") and lower_is_better("eval/faith/adversarial_jsd_len/01-04")
    assert not lower_is_better("val/faith/leave_one_out/tau") and not lower_is_better("val/faith/cf_uniform_flip_rate")


@pytest.mark.filterwarnings("ignore:The ``compute`` method")  # the other members: no batch fed
def test_the_suite_summarises_the_records_overall_and_per_bucket():
    rng = np.random.default_rng(0)
    steps = [(n, {"leave_one_out": step_agreement(rng.random((2, n)), rng.random(n))}) for n in (2, 3, 6, 7, 7)]
    records = FaithRecords(steps, [("uniform", 3, 4, 1), ("uniform", 6, 6, 3), ("permute", 3, 4, 0)],
                           [(2, 0.1), (7, 0.3), (7, 0.5)])
    suite = MetricSuite(spec("eval"))
    suite.update_faithfulness(records, alpha=0.5)
    values = suite.compute()
    assert set(values) <= set(names(spec("eval")))

    def tau_of(lengths):  # by hand: scipy on the mean over heads, the same arrays
        rng = np.random.default_rng(0)
        found = []
        for n in (2, 3, 6, 7, 7):
            attention, importance = rng.random((2, n)), rng.random(n)
            if n in lengths:
                found.append(kendalltau(attention.mean(0), importance))
        return found

    for key, lengths in (("eval/faith/leave_one_out/tau", range(1, 9)),
                         ("eval/faith/leave_one_out/tau_len/05-08", range(5, 9))):
        found = tau_of(lengths)
        assert values[key] == pytest.approx(np.mean([r.statistic for r in found]))
        significant = key.replace("/tau", "/significant")
        assert values[significant] == pytest.approx(np.mean([r.pvalue < 0.5 for r in found]))
    assert values["eval/faith/cf_uniform_flip_rate"] == pytest.approx(4 / 10)
    assert values["eval/faith/cf_uniform_flip_rate_len/01-04"] == pytest.approx(1 / 4)
    assert values["eval/faith/cf_permute_flip_rate"] == 0.0
    assert "eval/faith/cf_permute_flip_rate_len/05-08" not in values  # no step there
    assert values["eval/faith/adversarial_jsd"] == pytest.approx(0.3)
    assert values["eval/faith/adversarial_jsd_len/05-08"] == pytest.approx(0.4)
    suite.reset()
    assert suite.compute() == {}


def test_spread_picks_short_to_long_the_same_each_time():
    lengths = [5, 1, 9, 3, 7, 2]
    assert spread(lengths, 3) == spread(lengths, 3) == [1, 2, 3]  # the shortest (1), the longest (9), between (3)
    assert spread(lengths, 10) == list(range(6))


def small_model(scorer: str):
    torch.manual_seed(0)
    return build_seq2seq(ModelConfig(11, 13, embedding_dim=6, hidden_size=8, scorer=scorer)).double()


BATCH = (torch.tensor([[4, 7, 5, 9], [8, 4, 10, 0]]), torch.tensor([4, 3]), torch.tensor([[1, 3, 5], [1, 8, 4]]),
         torch.tensor([3, 2]))
SETTINGS = FaithSettings.model_validate({"samples": 2, "measures": ["leave_one_out", "grad_x_input"],
                                         "adversarial": {"samples": 3, "iterations": 3}})


def test_the_probe_runs_inside_inference_mode_and_agrees_with_its_parts():
    model = small_model("general")
    with torch.inference_mode():  # as Lightning's validation and the evaluator run it
        records = probe(model, *BATCH, SETTINGS)
    steps = step_importance(model, *BATCH, SETTINGS)
    assert [n for n, _ in records.agreements] == [4, 4, 4, 3, 3]
    for (_, found), step in zip(records.agreements, steps):
        for measure, expected in step.agreement().items():
            assert found[measure].mean.tau == pytest.approx(expected.mean.tau, nan_ok=True)
    src, src_lengths, tgt_in, tgt_lengths = BATCH
    with torch.no_grad():
        logits, _ = model(src, src_lengths, tgt_in)  # (B, T_dec, V)
    uniform = [(mode, n, s, f) for mode, n, s, f in records.flips if mode == "uniform"]
    assert [(n, s) for _, n, s, _ in uniform] == [(4, 3), (3, 2)] and all(0 <= f <= s for *_, s, f in uniform)
    assert len(records.jsd) == 3 and all(0.0 <= jsd <= math.log(2) for _, jsd in records.jsd)
    assert model.training and logits.shape == (2, 3, 13)


def test_uniform_attention_has_no_ranking_and_nothing_to_flip():
    model = small_model("uniform")
    records = probe(model, *BATCH, SETTINGS)
    summary = records.summary(0.05)
    assert not [key for key in summary if key.endswith(("/tau", "/significant", "/top1"))]  # NaN τ: not logged
    assert summary["cf_uniform_flip_rate"] == 0.0 and summary["cf_permute_flip_rate"] == 0.0
    assert "adversarial_jsd" in summary


@pytest.mark.slow
def test_training_logs_faith_curves_and_evaluation_logs_them_per_bucket(tmp_path):
    """One train.py (2 epochs, faith on) and one evaluate.py: a value per validation, then per bucket."""
    faith = ["faith.samples=6", "faith.ig_steps=4", "faith.adversarial.samples=4", "faith.adversarial.iterations=3"]
    trained = run_cli(tmp_path, *tiny(max_epochs=2, heatmaps=False), *faith, "threads=1",
                      *outputs_under(tmp_path, seeded=True))
    assert trained.returncode == 0, explain(trained)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri(tmp_path))
    [run] = all_runs(client)
    curves = [key for key in run.data.metrics if key.startswith("val/faith/")]
    assert {"val/faith/integrated_gradients/tau", "val/faith/leave_one_out/top1", "val/faith/cf_uniform_flip_rate",
            "val/faith/adversarial_jsd"} <= set(curves)
    for key in curves:
        history = client.get_metric_history(run.info.run_id, key)
        assert len(history) == len(client.get_metric_history(run.info.run_id, "val/acc")) == 2, key
    evaluated = run_cli(tmp_path, f"run_id={run.info.run_id}", "eval.size=64", "threads=1", *faith,
                        f"mlflow.tracking_uri={tracking_uri(tmp_path)}", f"hydra.run.dir={tmp_path}/eval",
                        script=EVALUATE_PY)
    assert evaluated.returncode == 0, explain(evaluated)
    [evaluation] = [r for r in all_runs(client) if r.data.tags.get("attnseq.kind") == "eval"]
    bucketed = [key for key in evaluation.data.metrics if key.startswith("eval/faith/") and "_len/" in key]
    assert any(key.startswith("eval/faith/leave_one_out/tau_len/") for key in bucketed)
    assert any(key.startswith("eval/faith/adversarial_jsd_len/") for key in bucketed)
    assert "eval/faith/cf_permute_flip_rate" in evaluation.data.metrics
