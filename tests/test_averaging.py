"""Checkpoint averaging (``average.k``, ``average.of``): the numbers against independent computations,
in-process and without a subprocess (the mean by NumPy of the saved state dicts, k=1 exactly the
last or the best model, the best chosen by the monitored metric and its mode, the kept weights
surviving a checkpoint); then tiny runs through the real ``train.py`` whose averaged model is in
MLflow beside the run's own, with its ``avg/val/...`` metrics, and loads as evaluation and the
served model load it: the last k, and the best k, which the real ``evaluate.py model=averaged_model``
evaluates. The config refusals are cases of ``test_config_validation``."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attnseq.model import ModelConfig, build_seq2seq
from attnseq.training.averaging import CheckpointAverage, average_state_dicts

MONITOR = "val/exact_match"


def tiny_model() -> torch.nn.Module:
    return build_seq2seq(ModelConfig(src_vocab_size=7, tgt_vocab_size=7, embedding_dim=4, hidden_size=6))


def validation(score: float | None, step: int, epoch: int) -> SimpleNamespace:
    """What ``CheckpointAverage`` reads of a Trainer at a validation's end."""
    return SimpleNamespace(sanity_checking=False, current_epoch=epoch, global_step=step,
                           callback_metrics={} if score is None else {MONITOR: torch.tensor(score)})


def train_and_save(callback: CheckpointAverage, scores: list[float | None], folder: Path) -> list[Path]:
    """A model changed before each validation (as training changes it), the callback told of each, and
    each validation's weights saved as a checkpoint's are: the files, oldest first."""
    torch.manual_seed(0)
    model = tiny_model()
    saved = []
    for epoch, score in enumerate(scores):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter))
        trainer = validation(score, 10 * (epoch + 1), epoch)
        callback.on_train_batch_start(trainer, None, None, 0)  # the batch before the validation
        callback.on_validation_end(trainer, SimpleNamespace(model=model))
        saved.append(folder / f"epoch{epoch}.pt")
        torch.save(model.state_dict(), saved[-1])
    return saved


def averaged(callback: CheckpointAverage) -> dict[str, torch.Tensor]:
    return average_state_dicts([kept.weights for kept in callback.kept])


def numpy_mean(files: list[Path]) -> dict[str, np.ndarray]:
    """The key-by-key mean of saved state dicts, by NumPy in double precision."""
    states = [torch.load(file, weights_only=True) for file in files]
    return {key: np.mean([state[key].double().numpy() for state in states], axis=0) for key in states[0]}


def callback(k: int, of: str = "last", mode: str = "max") -> CheckpointAverage:
    return CheckpointAverage(run=None, k=k, of=of, monitor=MONITOR, mode=mode)


def test_the_average_of_the_last_k_is_the_mean_of_their_saved_state_dicts(tmp_path):
    averaging = callback(3)
    files = train_and_save(averaging, [0.1, 0.2, 0.3, 0.4, 0.5], tmp_path)
    mean = numpy_mean(files[-3:])
    result = averaged(averaging)
    assert set(result) == set(mean)
    for key, value in result.items():
        assert value.dtype == torch.float32
        np.testing.assert_allclose(value.double().numpy(), mean[key], rtol=1e-6, atol=1e-7, err_msg=key)
    assert [kept.epoch for kept in averaging.kept] == [3, 4, 5]  # counted from 1


def test_the_average_of_the_best_k_is_the_mean_of_the_best_by_the_monitor_and_its_mode(tmp_path):
    scores = [0.5, 0.9, 0.1, 0.7, 0.3]
    for mode, best in (("max", [1, 3, 0]), ("min", [2, 4, 0])):  # the epochs of the 3 best, best first
        averaging = callback(3, "best", mode)
        files = train_and_save(averaging, scores, tmp_path)
        assert [kept.order for kept in averaging.kept] == sorted(best)  # averaged oldest first
        mean = numpy_mean([files[i] for i in best])
        for key, value in averaged(averaging).items():
            np.testing.assert_allclose(value.double().numpy(), mean[key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_k_1_is_exactly_the_last_or_the_best_model(tmp_path):
    scores = [0.2, 0.8, 0.8, 0.4]  # a tie: the first of equal scores is the best, as ModelCheckpoint keeps it
    for of, mode, chosen in (("last", "max", 3), ("best", "max", 1), ("best", "min", 0)):
        averaging = callback(1, of, mode)
        files = train_and_save(averaging, scores, tmp_path)
        expected = torch.load(files[chosen], weights_only=True)
        result = averaged(averaging)
        assert all(torch.equal(result[key], expected[key]) for key in expected), (of, mode)


def test_a_validation_without_the_monitored_metric_is_never_the_best(tmp_path):
    averaging = callback(2, "best", "min")
    train_and_save(averaging, [None, 0.5, math.nan, 0.9], tmp_path)
    assert [kept.order for kept in averaging.kept] == [1, 3]


def test_a_run_stopped_before_k_validations_averages_those_it_has_and_says_so(tmp_path):
    averaging = callback(4)
    train_and_save(averaging, [0.1, 0.2], tmp_path)
    assert len(averaging.kept) == 2
    assert "the last 2 checkpoints (epochs 1, 2), not average.k=4" in averaging.description()


def test_floating_point_tensors_are_averaged_and_the_others_are_the_newest():
    states = [{"w": torch.tensor([1.0, 2.0], dtype=torch.float16), "count": torch.tensor(n),
               "flag": torch.tensor([n % 2 == 0])} for n in (1, 2, 4)]
    for state, w in zip(states, ([1.0, 2.0], [3.0, 6.0], [8.0, 1.0]), strict=True):
        state["w"] = torch.tensor(w, dtype=torch.float16)
    result = average_state_dicts(states)
    assert result["w"].dtype == torch.float16 and result["w"].tolist() == [4.0, 3.0]
    assert result["count"].item() == 4 and result["flag"].tolist() == [True]
    with pytest.raises(ValueError, match="same keys"):
        average_state_dicts([{"a": torch.zeros(1)}, {"b": torch.zeros(1)}])


def test_the_kept_weights_survive_a_checkpoint_so_a_resumed_run_averages_the_same_ones(tmp_path):
    first = callback(2, "best")
    train_and_save(first, [0.3, 0.6, 0.2], tmp_path)
    torch.save({"callbacks": {"avg": first.state_dict()}}, tmp_path / "last.ckpt")
    resumed = callback(2, "best")
    resumed.load_state_dict(torch.load(tmp_path / "last.ckpt", weights_only=True)["callbacks"]["avg"])
    assert [(k.order, k.epoch, k.step, k.score) for k in resumed.kept] == \
        [(k.order, k.epoch, k.step, k.score) for k in first.kept]
    assert resumed.validations == 3 and resumed.validated_at == first.validated_at == 30
    assert all(torch.equal(averaged(resumed)[key], value) for key, value in averaged(first).items())


def test_the_averaged_model_is_validated_as_validation_validates_the_model(tmp_path):
    """``validate`` given the module's own weights reports exactly what Lightning's validation loop
    logged for them (same batches, with ``limit_val_batches`` too, same metrics): its ``avg/val/...``
    numbers are comparable with the run's ``val/...``."""
    import copy

    import lightning as L
    from hydra import compose, initialize_config_dir

    from attnseq.config import validate_train
    from attnseq.training import build_datamodule, build_module
    from attnseq.training.averaging import validate

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[
            "dataset.train_size=32", "dataset.val_size=48", "dataset.batch_size=16", "dataset.train_lengths=[1,6]",
            "dataset.eval_lengths=[1,10]", "model.hidden_size=8", "model.embedding_dim=8",
            f"paths.output_dir={tmp_path}", f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db"])
    config = validate_train(cfg)
    data = build_datamodule(config)
    data.setup()
    torch.manual_seed(0)
    module = build_module(config, data)
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=2,
                        enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=str(tmp_path))
    trainer.validate(module, datamodule=data, verbose=False)
    validated = {name: float(value) for name, value in trainer.callback_metrics.items()}
    result = validate(trainer, module, copy.deepcopy(module.model))
    assert {name.removeprefix("avg/") for name in result} == set(validated) - {"val/acc_best"}  # a running best
    for name, value in result.items():
        assert value == pytest.approx(validated[name.removeprefix("avg/")], rel=1e-6, abs=1e-7, nan_ok=True), name


# ---- through the real train.py: one tiny run ---------------------------------------------------------


@pytest.mark.slow
def test_a_run_with_average_logs_its_averaged_model_beside_its_own_and_it_loads(tmp_path):
    import mlflow
    import pandas as pd
    from cli_helpers import explain, tiny
    from conftest import train_once

    from attnseq.evaluation.trained_runs import load_trained_run
    from attnseq.tracking import paths, tags
    from attnseq.tracking.client import TrackingClient
    from attnseq.tracking.logged_model import logging_scope

    trained = train_once(tmp_path, *tiny(max_epochs=2, heatmaps=False), "average.k=2", "average.of=last")
    assert trained.proc.returncode == 0, explain(trained.proc)
    assert "into the MLflow model 'averaged_model'" in trained.proc.stdout, explain(trained.proc)
    client, [run] = trained.client, trained.runs
    run_id = run.info.run_id
    assert "the last 2 checkpoints (epochs 1, 2)" in run.data.tags[tags.AVERAGED]

    # its avg/val/... metrics, at the step of the last validation's
    averaged_metrics = {key for key in run.data.metrics if key.startswith("avg/")}
    assert {f"avg/{key}" for key in run.data.metrics if key.startswith("val/") and "_by_length" not in key
            and key != "val/acc_best"} == averaged_metrics
    [avg_point] = client.get_metric_history(run_id, "avg/val/exact_match")
    assert avg_point.step == max(m.step for m in client.get_metric_history(run_id, "val/exact_match"))

    # two logged models, each listing its own metrics only; the same flavour and signature
    models = {m.name: m for m in client.search_logged_models([run.info.experiment_id])}
    assert set(models) == {paths.MLFLOW_MODEL, paths.AVERAGED_MODEL}
    own, avg = (client.get_logged_model(models[name].model_id) for name in (paths.MLFLOW_MODEL, paths.AVERAGED_MODEL))
    assert {m.key for m in avg.metrics} == averaged_metrics
    assert not any(m.key.startswith("avg/") for m in own.metrics)
    assert avg.tags[tags.AVERAGED] == run.data.tags[tags.AVERAGED]
    with logging_scope(client):
        infos = [mlflow.models.get_model_info(f"runs:/{run_id}/{name}") for name in (paths.MLFLOW_MODEL,
                                                                                      paths.AVERAGED_MODEL)]
        served = mlflow.pyfunc.load_model(f"runs:/{run_id}/{paths.AVERAGED_MODEL}")
    assert infos[0].flavors.keys() == infos[1].flavors.keys() and infos[0].signature == infos[1].signature
    assert len(served.predict(pd.DataFrame({"source": ["s1 s2 s3"]}))["output"]) == 1

    # the averaged weights: the mean of the two kept in the last checkpoint, the newest being its model's
    checkpoint = torch.load(tmp_path / "out" / paths.LAST_CHECKPOINT, weights_only=True)
    [state] = [s for key, s in checkpoint["callbacks"].items() if key.startswith(CheckpointAverage.__name__)]
    kept = [c["weights"] for c in state["kept"]]
    model = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    assert all(torch.equal(kept[-1][key], value) for key, value in model.items())
    rebuilt = load_trained_run(TrackingClient(trained.uri), run, paths.AVERAGED_MODEL)  # as evaluate.py model=...
    assert rebuilt.name.endswith(paths.AVERAGED_MODEL)
    for key, value in rebuilt.model.state_dict().items():
        mean = np.mean([state[key].double().numpy() for state in kept], axis=0)
        np.testing.assert_allclose(value.double().numpy(), mean, rtol=1e-6, atol=1e-7, err_msg=key)


@pytest.mark.slow
def test_a_run_with_average_of_best_averages_the_k_best_validations_by_the_monitor(tmp_path):
    """``average.of=best`` through the real ``train.py``: 3 epochs, k = 2, monitored by val/acc (max): the
    averaged checkpoints are the two epochs whose logged val/acc is highest (of equal ones, the earlier),
    and the MLflow model averaged_model holds the mean of their weights, with its avg/val/... metrics;
    then the real ``evaluate.py model=averaged_model`` evaluates it as the library does."""
    from cli_helpers import BUCKET_WIDTH, EVAL_LENGTHS, EVALUATE_PY, all_runs, explain, run_cli, tiny
    from conftest import train_once

    from attnseq.evaluation.evaluator import EvalSettings, evaluate_run
    from attnseq.evaluation.trained_runs import load_trained_run
    from attnseq.tracking import paths
    from attnseq.tracking.client import TrackingClient

    trained = train_once(tmp_path, *tiny(max_epochs=3, heatmaps=False), "average.k=2", "average.of=best",
                         "checkpoint.monitor=val/acc", "checkpoint.mode=max")
    assert trained.proc.returncode == 0, explain(trained.proc)
    client, [run] = trained.client, trained.runs
    run_id = run.info.run_id
    assert (run.data.params["average.k"], run.data.params["average.of"]) == ("2", "best")
    history = sorted(client.get_metric_history(run_id, "val/acc"), key=lambda m: (m.step, m.timestamp))
    scores = {epoch: m.value for epoch, m in enumerate(history, start=1)}  # one validation an epoch
    assert len(scores) == 3
    best = sorted(sorted(scores, key=lambda epoch: (-scores[epoch], epoch))[:2])

    checkpoint = torch.load(tmp_path / "out" / paths.LAST_CHECKPOINT, weights_only=True)
    [state] = [s for key, s in checkpoint["callbacks"].items() if key.startswith(CheckpointAverage.__name__)]
    assert sorted(c["epoch"] for c in state["kept"]) == best, (scores, [c["epoch"] for c in state["kept"]])
    for kept in state["kept"]:
        assert kept["score"] == pytest.approx(scores[kept["epoch"]])
    rebuilt = load_trained_run(TrackingClient(trained.uri), run, paths.AVERAGED_MODEL).model
    for key, value in rebuilt.state_dict().items():
        mean = np.mean([c["weights"][key].double().numpy() for c in state["kept"]], axis=0)
        np.testing.assert_allclose(value.double().numpy(), mean, rtol=1e-6, atol=1e-7, err_msg=key)
    assert "avg/val/acc" in run.data.metrics

    # evaluate.py model=averaged_model decodes the averaged weights: its metrics are the library's on them
    proc = run_cli(tmp_path, f"run_id={run_id}", "model=averaged_model", f"eval.lengths=[{EVAL_LENGTHS[0]},"
                   f"{EVAL_LENGTHS[1]}]", f"eval.bucket_width={BUCKET_WIDTH}", "eval.size=40", "eval.seed=1",
                   "eval.counterfactual=false", "eval.explorer_samples=0", f"mlflow.tracking_uri={trained.uri}",
                   f"hydra.run.dir={tmp_path}/eval", script=EVALUATE_PY)
    assert proc.returncode == 0, explain(proc)
    [evaluation] = [r for r in all_runs(client) if r.data.tags.get("attnseq.kind") == "eval"]
    assert evaluation.data.params["eval.model"].endswith(paths.AVERAGED_MODEL)
    expected = evaluate_run(load_trained_run(TrackingClient(trained.uri), run, paths.AVERAGED_MODEL),
                            EvalSettings(EVAL_LENGTHS, BUCKET_WIDTH, size=40, counterfactual=False, seed=1,
                                         explorer_samples=0))
    for key in ("eval/acc", "eval/exact_match"):
        assert evaluation.data.metrics[key] == pytest.approx(expected.metrics[key]), key
