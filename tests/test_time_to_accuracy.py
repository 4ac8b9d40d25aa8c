"""Time to accuracy (benchmarks/time_to_accuracy.py) and the option it stops the CLI with
(``training.stop_at``): the textbook baseline's decoding and exact match on hand-built batches,
the seconds and medians read from validation results, and (slow) the quick run through the real CLI,
also timed phase by phase (benchmarks/run_breakdown.py)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from pathlib import Path

import pytest
import torch
from benchmark_scripts import imported  # tests/ on sys.path
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from attnseq.config import validate_train as check_config
from attnseq.data.vocab import BOS, EOS, PAD
from attnseq.errors import ConfigError
from attnseq.training.stopping import stop_at

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tta():
    """benchmarks/time_to_accuracy.py imported as the script sees its siblings (its folder first on sys.path)."""
    with imported("time_to_accuracy") as module:
        yield module


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("train", overrides=list(overrides))


# -- training.stop_at


def test_stop_at_null_adds_no_callback():
    assert stop_at(check_config(composed())) == []


def test_stop_at_is_reached_at_the_value_itself_in_the_monitor_direction():
    (callback,) = stop_at(check_config(composed("training.stop_at=0.95", "checkpoint.monitor=val/acc")))
    assert (callback.monitor, callback.mode, callback.value) == ("val/acc", "max", 0.95)
    assert [callback.reached(v) for v in (0.949, 0.95, 1.0)] == [False, True, True]
    (lowest,) = stop_at(check_config(composed("training.stop_at=0.1", "checkpoint.monitor=val/loss",
                                              "checkpoint.mode=min")))
    assert [lowest.reached(v) for v in (0.11, 0.1, 0.0)] == [False, True, True]


def test_stop_at_is_checked_as_a_number():
    check_config(composed("training.stop_at=0.95"))
    with pytest.raises(ConfigError, match="training.stop_at"):
        check_config(composed("training.stop_at=soon"))


def test_copy_fast_preset_composes_a_valid_config():
    cfg = composed("experiment=copy_fast")
    check_config(cfg)
    assert list(cfg.dataset.train_lengths) == [5, 40] and cfg.training.stop_at == 0.95


# -- the textbook baseline


@pytest.fixture
def textbook_pair(tta):
    loops = importlib.import_module("loops")  # benchmarks/ is on sys.path while tta is in use
    torch.manual_seed(0)
    recomputed = loops.TextbookBahdanau(7, 9, 5, 6)
    once = loops.TextbookBahdanau(7, 9, 5, 6, project_keys_once=True)
    once.load_state_dict(recomputed.state_dict())
    return recomputed, once


def test_projecting_keys_once_changes_no_logit(textbook_pair):
    recomputed, once = textbook_pair
    src = torch.tensor([[4, 5, 6, 3], [5, 4, PAD, PAD]])
    lengths = torch.tensor([4, 2])
    tgt_in = torch.tensor([[BOS, 4, 5, 6, 3], [BOS, 5, 4, PAD, PAD]])
    expected, _ = recomputed(src, lengths, tgt_in)
    got, _ = once(src, lengths, tgt_in)
    torch.testing.assert_close(got, expected)


def test_greedy_feeds_back_its_own_argmax(textbook_pair):
    """Teacher-forcing the greedy output reproduces it: each token is the argmax after the previous ones."""
    _, model = textbook_pair
    src = torch.tensor([[4, 5, 6, 3], [5, 4, PAD, PAD]])
    lengths = torch.tensor([4, 2])
    tokens = model.greedy(src, lengths, max_length=6)  # (B, T_out)
    fed = torch.cat([torch.full((2, 1), BOS), tokens[:, :-1].clamp(min=0)], dim=1)  # (B, T_out)
    logits, _ = model(src, lengths, fed)
    for row in range(2):
        ended = (tokens[row] == EOS).nonzero()
        stop = int(ended[0]) + 1 if len(ended) else tokens.shape[1]
        assert torch.equal(logits[row, :stop].argmax(-1), tokens[row, :stop])
        assert bool((tokens[row, stop:] == PAD).all())


def test_exact_rows_counts_every_real_position_and_only_those(tta):
    target = torch.tensor([[4, 5, EOS], [4, EOS, PAD], [6, 6, EOS]])
    lengths = torch.tensor([3, 2, 3])
    tokens = torch.tensor(
        [
            [4, 5, EOS, PAD, PAD],  # right
            [4, EOS, 9, 9, 9],  # right: what follows the real positions does not count
            [6, 6, 6, 6, 6],  # no EOS where the target has it
        ]
    )
    assert tta.exact_rows(tokens, target, lengths).tolist() == [True, True, False]
    assert tta.exact_rows(tokens[:, :1], target, lengths).tolist() == [False, False, False]  # cut short


# -- seconds and medians


def test_seconds_are_those_of_the_first_validation_at_the_target(tta):
    attempt = tta.Attempt("cli", 0, [(10.0, 100, 0.5), (20.0, 200, 0.95), (30.0, 300, 0.99)], 35.0, 0.95)
    assert attempt.reached == (20.0, 200)
    assert tta.Attempt("cli", 0, [(10.0, 100, 0.949)], 600.0, 0.95).seconds is None


def test_median_counts_a_run_not_reached_as_the_slowest(tta):
    def attempt(seconds):
        validations = [(seconds, 1, 1.0)] if seconds is not None else [(5.0, 1, 0.5)]
        return tta.Attempt("cli", 0, validations, 60.0, 0.95)

    assert tta.median_seconds([attempt(30.0), attempt(10.0), attempt(20.0)]) == 20.0
    assert tta.median_seconds([attempt(30.0), attempt(None), attempt(10.0)]) == 30.0
    assert tta.median_seconds([attempt(None), attempt(None), attempt(10.0)]) is None


def test_validation_cadence_reads_val_check_interval_as_lightning_does(tta):
    def cadence(value):
        return tta.validation_every(OmegaConf.create({"val_check_interval": value}), 200)

    assert (cadence(1.0), cadence(0.5), cadence(30), cadence(None)) == (200, 100, 30, 200)


# -- the quick run, through the real CLI


@pytest.mark.slow
def test_quick_run_reaches_the_target_at_the_first_validation_and_stops_there(tta, tmp_path):
    settings = tta.make_settings(
        argparse.Namespace(quick=True, target=None, budget=300.0, threads=1, seeds=1, defaults=False)
    )
    random_batches = "cli, random batches"
    settings = dataclasses.replace(settings, variants={random_batches: tta.BATCHINGS[random_batches]})
    cli, textbook, variant = tta.measure(settings, log=lambda line: None, workdir=tmp_path)
    # target 0: the first validation reaches it, after half an epoch (4 batches, val_check_interval=0.5)
    assert cli.reached[1] == 2 and textbook.reached[1] == 2 and variant.reached[1] == 2
    assert len(cli.validations) == 1  # training.stop_at ended the CLI there
    assert 0 < cli.seconds <= cli.wall_s and 0 < textbook.seconds <= textbook.wall_s
    (run,) = MlflowClient(f"sqlite:///{tmp_path}/variant0-0/mlflow.db").search_runs(["1"])
    assert variant.who == random_batches and run.data.params["dataset.length_bucketing"] == "False"
    report = tta.render(settings, [cli, textbook, variant], "python benchmarks/time_to_accuracy.py --quick", "m", "c")
    assert "| cli | " in report and "| textbook | " in report and f"| {random_batches} | " in report


@pytest.mark.slow
def test_a_textbook_run_that_never_reaches_the_target_trains_all_epochs(tta):
    settings = tta.make_settings(
        argparse.Namespace(quick=True, target=1.01, budget=300.0, threads=1, seeds=1, defaults=False)
    )
    attempt = tta.run_textbook(settings, settings.task, seed=0)
    assert attempt.reached is None
    assert [step for _, step, _ in attempt.validations] == [2, 4, 6, 8]  # 2 epochs × 2 validations
    assert "not reached" in tta.describe(attempt)


@pytest.mark.slow
def test_a_breakdown_of_the_quick_run_puts_each_second_in_one_phase(tta, tmp_path):
    """``run_breakdown``: the quick task through the real CLI, its functions timed as they are imported; the
    phases' own seconds and the rest add up to the launch's wall time, and the phases a run must go through
    (the imports, the data, validation's decoding, training, uploads) each took some."""
    breakdown = importlib.import_module("run_breakdown")
    (found,) = breakdown.measure([0], threads=1, task=tta.QUICK_TASK, target=0.0, log=lambda line: None)
    assert found.target_s is not None and 0 < found.target_s <= found.wall_s
    assert 0 < found.first_step_s < found.wall_s and found.validations == 1
    assert sum(found.own_s.values()) == pytest.approx(found.wall_s)
    timed = {label: seconds for label, seconds in found.own_s.items() if label != breakdown.REST}
    assert all(seconds >= 0 for seconds in timed.values())
    for must in ("start-up: importing torch, Lightning, MLflow", "data: examples made, vocabularies built",
                 "validation: greedy decoding", breakdown.TRAINING,
                 "uploads: images, tables, texts, checkpoints, MLflow model"):
        assert timed[must] > 0, must
    report = breakdown.render([found], 1, tta.QUICK_TASK, 0.0)
    assert all(f"| {label} | " in report for label in found.own_s)
