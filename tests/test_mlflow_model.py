"""The MLflow model a training run logs (``attnseq.serving``): reading sources, decoding limits and
errors on hand-built models with known outputs, the n best of a random one; then, on a run trained
through ``train.py``, the same predictions (greedy, beam with α, the n best) through ``mlflow.pyfunc``,
``mlflow models predict``, ``mlflow models serve`` and a registered version, checked against the model
library decoding the run's own model file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import torch
from cli_helpers import artifact_paths, clean_env, explain, free_port, stop_group, tracking_uri
from mlflow.entities import LoggedModelStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from serving_checks import assert_n_best_as_the_library, expected_outputs

from attnseq.data import SPACE_TOKEN, Vocabulary
from attnseq.data.tasks import tokenizer_for
from attnseq.model import ModelConfig, beam_search_n_best, build_seq2seq
from attnseq.serving.predictor import DecodeLimit, InvalidSource, Translator
from attnseq.tracking import paths
from attnseq.tracking.logged_model import logging_scope, pip_requirements

SYMBOLS = [f"s{i}" for i in range(10)]
SOURCES = ["s3 s1 s4", "s0", "s9 s8 s7 s6 s5 s4 s3 s2 s1 s0 s1 s2"]  # the last is longer than training


# -- hand-built models: known outputs ---------------------------------------------------------
def constant_translator(output_id: int, limit: DecodeLimit | None = None) -> Translator:
    """A model whose every step emits ``output_id``: zero readout weights, a bias only there."""
    src_vocab, tgt_vocab = Vocabulary(SYMBOLS), Vocabulary(["x", "y"])
    model = build_seq2seq(ModelConfig(len(src_vocab), len(tgt_vocab), embedding_dim=4, hidden_size=6)).eval()
    with torch.no_grad():
        model.decoder.readout.weight.zero_()
        model.decoder.readout.bias.fill_(-10.0)
        model.decoder.readout.bias[output_id] = 10.0
    symbols = tokenizer_for({"task": "copy"})
    return Translator(model, src_vocab, tgt_vocab, symbols, symbols, limit or DecodeLimit(1.5, 5))


def test_an_output_without_eos_stops_at_its_own_source_length_limit_whatever_shares_its_batch():
    x = Vocabulary(["x", "y"]).encode(["x"])[0]
    translator = constant_translator(x, DecodeLimit(ratio=1.5, extra=2))
    outputs = translator.translate(["s1", "s1 s2 s3 s4", "s5 s6"])
    # 1.5 × 1 + 2 = 3, 1.5 × 4 + 2 = 8, 1.5 × 2 + 2 = 5 tokens
    assert outputs == ["x x x", "x x x x x x x x", "x x x x x"]
    assert translator.translate(["s1"]) == ["x x x"]  # alone: the same
    assert translator.translate(["s1 s2"], beam_size=3) == ["x x x x x"]


def test_an_output_that_starts_with_eos_is_empty():
    from attnseq.data import EOS

    assert constant_translator(EOS).translate(["s1 s2", "s3"]) == ["", ""]


def test_sources_are_read_as_the_run_read_its_data():
    symbols = tokenizer_for({"task": "copy"})
    assert symbols.tokenize("  s3 s1\ts4 ") == ["s3", "s1", "s4"]
    words = tokenizer_for({"task": "tsv", "tokenizer": "word", "lowercase": True})
    assert words.tokenize("Hello, World!") == ["hello", ",", "world", "!"]
    assert words.detokenize(["hello", ",", "world", "!"]) == "hello , world !"
    chars = tokenizer_for({"task": "tsv", "tokenizer": "char", "lowercase": False})
    assert chars.tokenize("Ab c") == ["A", "b", SPACE_TOKEN, "c"]
    assert chars.detokenize(["A", "b", SPACE_TOKEN, "c"]) == "Ab c"
    assert symbols.detokenize(["s3", "s1"]) == "s3 s1"


def test_the_decode_limit_is_the_validation_one():
    limit = DecodeLimit.of_config({"decode": {"max_length_ratio": 2.0, "max_length_extra": 1}})
    assert [limit(n) for n in (1, 3, 7)] == [3, 7, 15]
    assert DecodeLimit.of_config({})(4) == int(4 * 1.5) + 5


@pytest.mark.parametrize(
    "sources, message",
    [
        (["s1 s2", "s1 q7 s2 zz"], "source 1 ('s1 q7 s2 zz') has tokens the model's vocabulary does not hold: "
                                   "'q7', 'zz'"),
        (["s1", ""], "source 1 ('') holds no tokens"),
        (["   "], "source 0 ('   ') holds no tokens"),
        ([None], "source 0 (None) holds no tokens"),
    ],
)
def test_unknown_tokens_and_empty_sources_are_named_with_a_fix(sources, message):
    with pytest.raises(InvalidSource) as caught:
        constant_translator(4).translate(sources)
    assert message in str(caught.value)
    assert "Fix:" in str(caught.value)


@pytest.mark.parametrize("settings", [{"beam_size": 0}, {"beam_size": 2.5}, {"beam_size": True},
                                      {"length_penalty": -1.0}])
def test_bad_decoding_params_are_refused(settings):
    with pytest.raises(InvalidSource, match="Fix:"):
        constant_translator(4).translate(["s1"], **settings)


def random_translator(seed: int = 0) -> Translator:
    """An untrained model over a target vocabulary of 8 words: its outputs vary, and so do their n best."""
    torch.manual_seed(seed)
    src_vocab, tgt_vocab = Vocabulary(SYMBOLS), Vocabulary([f"w{i}" for i in range(8)])
    model = build_seq2seq(ModelConfig(len(src_vocab), len(tgt_vocab), embedding_dim=4, hidden_size=6)).eval()
    symbols = tokenizer_for({"task": "copy"})
    return Translator(model, src_vocab, tgt_vocab, symbols, symbols, DecodeLimit(1.0, 2))


def test_the_n_best_are_the_model_librarys_for_each_source_alone_and_the_first_is_the_output():
    translator = random_translator()
    sources = ["s1 s2 s3", "s4", "s5 s6 s7", "s8 s9 s0 s1 s2"]  # two of one length: one batch
    found = translator.translate_n_best(sources, beam_size=5, n_best=3, length_penalty=0.6)
    assert [best[0].output for best in found] == translator.translate(sources, beam_size=5, length_penalty=0.6)
    for source, best in zip(sources, found):
        ids = torch.tensor([translator.src_vocab.encode(source.split())])  # (1, T_src)
        alone = beam_search_n_best(translator.model, ids, torch.tensor([ids.shape[1]]), 5, 3,
                                   max_length=ids.shape[1] + 2, length_penalty=0.6)
        texts = [translator.output_text(alone.tokens[0, k, : int(alone.lengths[0, k])].tolist()) for k in range(3)]
        assert [h.output for h in best] == texts  # distinct outputs; an untrained one's texts may repeat (PAD, BOS)
        assert [h.score for h in best] == pytest.approx(alone.rank_scores[0].tolist(), abs=1e-5)
        assert [h.log_prob for h in best] == pytest.approx(alone.scores[0].tolist(), abs=1e-5)
    (one,) = translator.translate_n_best(sources[:1], beam_size=1, n_best=1)  # greedy, with its log-probability
    assert [h.output for h in one] == translator.translate(sources[:1])


@pytest.mark.parametrize("n_best", [0, 5, 2.5, True, "2"])
def test_a_bad_n_best_is_refused_with_a_fix(n_best):
    with pytest.raises(InvalidSource, match=r"n_best=(.|\n)*Fix:"):
        random_translator().translate_n_best(["s1"], beam_size=4, n_best=n_best)


def test_the_logging_scope_puts_back_the_tracking_uri_the_environment_and_sys_path(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    before_uri, before_path = mlflow.get_tracking_uri(), list(sys.path)
    client = MlflowClient(tracking_uri(tmp_path))
    with logging_scope(client):
        assert mlflow.get_tracking_uri() == tracking_uri(tmp_path)
        sys.path.insert(0, str(tmp_path))
    assert mlflow.get_tracking_uri() == before_uri
    assert os.environ["MLFLOW_TRACKING_URI"] == "sqlite:///elsewhere.db"
    assert "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR" not in os.environ
    assert sys.path == before_path


# -- a trained run -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tiny_run):
    """(store URI, run id) of the session's tiny run, trained through train.py (conftest)."""
    return tiny_run.uri, tiny_run.runs[0].info.run_id


def model_uri(run_id: str) -> str:
    return f"runs:/{run_id}/{paths.MLFLOW_MODEL}"


@pytest.mark.slow
def test_the_pyfunc_model_decodes_as_the_model_library_does(trained):
    uri, run_id = trained
    with logging_scope(MlflowClient(uri)):
        model = mlflow.pyfunc.load_model(model_uri(run_id))
    table = pd.DataFrame({"source": SOURCES})
    assert model.predict(table)["output"].tolist() == expected_outputs(uri, run_id, SOURCES)
    beam = model.predict(table, params={"beam_size": 4})["output"].tolist()
    assert beam == expected_outputs(uri, run_id, SOURCES, beam_size=4)
    penalised = model.predict(table, params={"beam_size": 4, "length_penalty": 0.6})["output"].tolist()
    assert penalised == expected_outputs(uri, run_id, SOURCES, beam_size=4, length_penalty=0.6)
    n_best = model.predict(table, params={"beam_size": 4, "length_penalty": 0.6, "n_best": 3})
    assert_n_best_as_the_library(n_best, expected_outputs(uri, run_id, SOURCES, 4, 0.6, n_best=3))
    assert n_best["output"].tolist() == penalised  # the first of the n best is the beam's output
    with pytest.raises(MlflowException, match=r"does not hold: 's99'(.|\n)*Fix: use only the 10 tokens"):
        model.predict(pd.DataFrame({"source": ["s1 s99"]}))
    with pytest.raises(MlflowException, match=r"n_best=5 must be(.|\n)*Fix: pass beam_size=5"):
        model.predict(table, params={"beam_size": 4, "n_best": 5})
    assert model.metadata.get_params_schema().to_dict() == [
        {"name": "beam_size", "type": "long", "default": 1, "shape": None},
        {"name": "length_penalty", "type": "double", "default": 0.0, "shape": None},
        {"name": "n_best", "type": "long", "default": 1, "shape": None},
    ]
    declared = [column["name"] for column in model.metadata.get_output_schema().to_dict()]
    assert declared == ["output", "outputs", "scores", "log_probs"]


@pytest.mark.slow
def test_the_run_lists_its_model_with_its_final_metrics_and_it_registers(trained, tmp_path):
    uri, run_id = trained
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    models = client.search_logged_models([run.info.experiment_id])
    ready = LoggedModelStatus.READY
    assert [(m.name, m.source_run_id, m.status) for m in models] == [(paths.MLFLOW_MODEL, run_id, ready)]
    logged = client.get_logged_model(models[0].model_id)
    assert [output.model_id for output in run.outputs.model_outputs] == [logged.model_id]
    linked = {metric.key: metric.value for metric in logged.metrics}
    assert linked["val/acc"] == run.data.metrics["val/acc"]
    assert linked["val/exact_match"] == run.data.metrics["val/exact_match"]
    history = client.get_metric_history(run_id, "val/acc")
    assert len({(m.step, m.timestamp) for m in history}) == len(history)  # linking added no point
    # the run's own weights/ folder lists through a client of its store, whatever the process-wide one
    assert {paths.MODEL_FILE, paths.MODEL_SUMMARY} <= artifact_paths(client, run_id, "weights")
    requirements = Path(mlflow.artifacts.download_artifacts(f"{logged.artifact_location}/requirements.txt",
                                                            dst_path=str(tmp_path))).read_text().split()
    assert requirements == pip_requirements()

    with logging_scope(client):
        version = mlflow.register_model(model_uri(run_id), "attnseq-copy")
        registered = mlflow.pyfunc.load_model("models:/attnseq-copy/1")
    assert int(version.version) == 1 and version.run_id == run_id and version.source == f"models:/{logged.model_id}"
    assert registered.metadata.model_id == logged.model_id
    output = registered.predict(pd.DataFrame({"source": SOURCES[:1]}))["output"].tolist()
    assert output == expected_outputs(uri, run_id, SOURCES[:1])


def mlflow_env(uri: str) -> dict[str, str]:
    """The store, and this interpreter's scripts first on PATH (``mlflow models serve`` runs ``uvicorn``)."""
    scripts = str(Path(sys.executable).parent)
    return clean_env() | {"MLFLOW_TRACKING_URI": uri, "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.slow
def test_mlflow_models_predict_decodes_a_json_file(trained, tmp_path):
    uri, run_id = trained
    request = {"dataframe_split": {"columns": ["source"], "data": [[s] for s in SOURCES]}, "params": {"beam_size": 3}}
    (tmp_path / "in.json").write_text(json.dumps(request))
    proc = subprocess.run(
        [sys.executable, "-m", "mlflow", "models", "predict", "-m", model_uri(run_id), "-i", "in.json",
         "-t", "json", "-o", "out.json", "--env-manager", "local"],
        cwd=tmp_path, env=mlflow_env(uri), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, explain(proc)
    predictions = json.loads((tmp_path / "out.json").read_text())["predictions"]
    assert [row["output"] for row in predictions] == expected_outputs(uri, run_id, SOURCES, beam_size=3)


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.slow
def test_mlflow_models_serve_answers_rest_calls_on_loopback(trained, tmp_path):
    uri, run_id = trained
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri(run_id), "--env-manager", "local",
         "--host", "127.0.0.1", "-p", str(port), "-w", "1"],
        cwd=tmp_path, env=mlflow_env(uri), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"{base}/ping", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the server did not answer /ping within 180 s"
            time.sleep(1)
        status, body = post(f"{base}/invocations", {"dataframe_records": [{"source": s} for s in SOURCES]})
        assert status == 200, body
        assert [row["output"] for row in body["predictions"]] == expected_outputs(uri, run_id, SOURCES)
        status, body = post(f"{base}/invocations", {"inputs": {"source": SOURCES[:2]}, "params": {"beam_size": 2}})
        assert status == 200, body
        assert [row["output"] for row in body["predictions"]] == expected_outputs(uri, run_id, SOURCES[:2], 2)
        status, body = post(f"{base}/invocations", {"inputs": {"source": SOURCES[:2]},
                                                    "params": {"beam_size": 3, "n_best": 2, "length_penalty": 0.6}})
        assert status == 200, body
        expected = expected_outputs(uri, run_id, SOURCES[:2], 3, 0.6, n_best=2)
        assert_n_best_as_the_library(pd.DataFrame(body["predictions"]), expected)  # lists in JSON
        status, body = post(f"{base}/invocations", {"dataframe_records": [{"source": "s1 nope"}]})
        assert status == 400
        assert "does not hold: 'nope'" in body["message"] and "Fix:" in body["message"]
    finally:
        stop_group(server)
        log.close()


