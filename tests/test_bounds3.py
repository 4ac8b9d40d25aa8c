"""Issue 23, points 6 and 9: every size has an upper bound, checked before anything exists.

Training (``train.py``): a value that would crash or exhaust the machine once the run exists exits 2
naming its key, and no store or run is created; a bad corpus or tokenizer setting is rejected before
the store is. Serving (the pyfunc model) and evaluation (``evaluate.py``): a request's or an
evaluation's cost is bounded (beam width, source and output length, kept attention), and a refused
input is echoed short."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from cli_helpers import EVALUATE_PY, explain, outputs_under, run_cli, tiny, tracking_uri, user_env

HUGE = "1000000000000"

# -- training: each bound names its key ---------------------------------------------------------------
TRAIN_BOUNDS = [
    (["threads=" + HUGE], "threads="),
    (["model.hidden_size=" + HUGE], "model.hidden_size="),
    (["model.embedding_dim=" + HUGE], "model.embedding_dim="),
    (["scorer.attn_dim=" + HUGE], "scorer.attn_dim="),
    (["model.layers=" + HUGE], "model.layers="),
    (["dataset.num_symbols=" + HUGE], "dataset.num_symbols="),
    (["dataset.num_workers=" + HUGE], "dataset.num_workers="),
    (["dataset=tsv", "dataset.path={corpus}", "dataset.tokenizer=bpe", "dataset.vocab_size=" + HUGE],
     "dataset.vocab_size="),
    (["mlflow.retry_budget_s=" + HUGE], "mlflow.retry_budget_s="),
    (["trainer.devices=0"], "trainer.devices="),
    (["trainer.val_check_interval=0"], "trainer.val_check_interval="),
    (["optimizer.lr=" + HUGE], "optimizer.lr="),
    # within every bound, but the model alone (weights, gradients, optimizer state) cannot fit: the model is named
    (["model.hidden_size=60000", "model.layers=8"], "model.hidden_size=60000 needs at least"),
    (["model.hidden_size=65536", "model.heads=65536"], "model.hidden_size=65536 needs at least"),
]


def small(*overrides: str) -> list[str]:
    """``tiny()`` sizes (a value that is not refused trains for seconds, not minutes), then ``overrides``."""
    keys = {override.split("=")[0] for override in overrides} | ({"dataset.num_symbols"} if "dataset=tsv" in overrides
                                                                  else set())
    return [*(o for o in tiny(max_epochs=1, heatmaps=False) if o.split("=")[0] not in keys), *overrides]


def assert_refused_before_the_store(proc, root, fragment: str) -> None:
    assert proc.returncode == 2, explain(proc)
    assert "Traceback" not in proc.stderr and proc.stderr.count("error: ") == 1, proc.stderr[-3000:]
    assert fragment in proc.stderr.split("error: ", 1)[1].split("\n")[0], proc.stderr[-3000:]
    assert not (root / "mlflow.db").exists(), "the store was created before the value was refused"


@pytest.mark.parametrize(("overrides", "fragment"), TRAIN_BOUNDS, ids=[" ".join(o) for o, _ in TRAIN_BOUNDS])
def test_a_size_past_its_bound_exits_2_naming_its_key_before_the_store_exists(overrides, fragment, tmp_path):
    overrides = [o.format(corpus=corpus(tmp_path / "pairs.tsv")) for o in overrides]
    proc = run_cli(tmp_path, *small(*overrides), *outputs_under(tmp_path), env=user_env(), timeout=120)
    assert_refused_before_the_store(proc, tmp_path, fragment)
    assert not (tmp_path / "out").exists()  # refused before Hydra made the run's folder


def corpus(path, lines: int = 60) -> str:
    words = "the cat sees a dog and my bird likes this red fish".split()
    rows = [" ".join(words[(i + k) % len(words)] for k in range(4)) + "\t" +
            " ".join(words[(i * 3 + k) % len(words)] for k in range(3)) for i in range(lines)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["a line without a tab", "a vocabulary smaller than the characters"])
def test_a_bad_corpus_or_tokenizer_setting_is_refused_before_the_store_is_created(case, tmp_path):
    path = tmp_path / "pairs.tsv"
    corpus(path)
    if case == "a line without a tab":
        with path.open("a", encoding="utf-8") as handle:
            handle.write("no tab here\n")
        settings, fragment = [], "pairs.tsv:61: no tab"  # the file and the line
    else:
        settings, fragment = ["dataset.tokenizer=bpe", "dataset.vocab_size=3"], "dataset.vocab_size=3"
    proc = run_cli(tmp_path, "dataset=tsv", f"dataset.path={path}", *settings, "dataset.train_size=40",
                   "dataset.val_size=10", "dataset.test_size=10", "trainer.max_epochs=1", *outputs_under(tmp_path),
                   env=user_env(), timeout=180)
    assert_refused_before_the_store(proc, tmp_path, fragment)
    assert "Fix:" in proc.stderr, proc.stderr[-3000:]


# -- serving: what one request may cost -------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(tiny_run):
    """``load(**model_config)``: the session's tiny run's MLflow model, loaded as a server loads it."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from attnseq.tracking import paths
    from attnseq.tracking.logged_model import logging_scope

    def load(**model_config):
        with logging_scope(MlflowClient(tiny_run.uri)):
            return mlflow.pyfunc.load_model(f"runs:/{tiny_run.runs[0].info.run_id}/{paths.MLFLOW_MODEL}",
                                            model_config=model_config or None)
    return load


def refused(model, sources: list[str], **params) -> str:
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as caught:
        model.predict(pd.DataFrame({"source": sources}), params=params or None)
    return str(caught.value)


@pytest.mark.slow
def test_the_served_model_refuses_a_request_past_its_limits_naming_them(served):
    model = served()
    assert "length_penalty=inf" in refused(model, ["s1 s2"], beam_size=2, length_penalty=float("inf"))
    assert "max_beam_size" in refused(model, ["s1 s2"], beam_size=1000)
    assert "limit of 256 (max_source_tokens)" in refused(model, [" ".join(["s1"] * 300)], beam_size=4)
    assert model.predict(pd.DataFrame({"source": ["s1 s2"]}), params={"beam_size": 16})["output"].tolist()


@pytest.mark.slow
def test_a_refused_source_is_echoed_short(served):
    model = served()
    token = "x" * 5_000_000
    message = refused(model, [f"s1 {token}"])
    assert "does not hold" in message and len(message) < 2000, len(message)
    assert "5000003 characters" in message  # what was cut is said
    assert len(refused(model, [" ".join([token] * 300)])) < 2000


@pytest.mark.slow
def test_the_limits_are_the_models_config_a_server_may_set(served):
    model = served(max_beam_size=2, max_source_tokens=4, max_output_tokens=2)
    assert "must be a whole number in [1, 2]" in refused(model, ["s1 s2"], beam_size=3)
    assert "limit of 4 (max_source_tokens)" in refused(model, ["s1 s2 s3 s4 s5"])
    for beam in (1, 2):  # every output stops at max_output_tokens (the decode limit alone would allow 9)
        outputs = model.predict(pd.DataFrame({"source": ["s1 s2 s3 s4"]}), params={"beam_size": beam})["output"]
        assert len(outputs[0].split()) <= 2, outputs
    assert "n_best=3 must be a whole number in [1, beam_size=2]" in refused(model, ["s1 s2"], beam_size=2, n_best=3)
    n_best = model.predict(pd.DataFrame({"source": ["s1 s2 s3 s4"]}), params={"beam_size": 2, "n_best": 2})
    assert all(len(output.split()) <= 2 for output in n_best["outputs"][0]), n_best  # the n best stop there too


# -- evaluation: each size bounded before anything heavy ------------------------------------------------------
EVAL_BOUNDS = [
    ("eval.beam_size=100000", "eval.beam_size=100000"),
    ("eval.n_best=100000", "eval.n_best=100000"),
    ("eval.lengths=[1,100000]", "eval.lengths=[1,100000]"),
    ("eval.sentences=['" + " ".join(["s1"] * 20000) + "']", "eval.sentences="),
]


@pytest.mark.parametrize(("override", "fragment"), EVAL_BOUNDS, ids=["beam_size", "n_best", "lengths", "sentences"])
def test_an_evaluation_past_its_bounds_exits_2_naming_the_key_and_echoing_it_short(override, fragment, tmp_path):
    proc = run_cli(tmp_path, "run_id=0123456789abcdef0123456789abcdef", override,
                   f"mlflow.tracking_uri={tracking_uri(tmp_path)}", f"hydra.run.dir={tmp_path}/out",
                   script=EVALUATE_PY, env=user_env(), timeout=120)
    assert_refused_before_the_store(proc, tmp_path, fragment)
    assert len(proc.stderr) < 3000, proc.stderr[:3000]


@pytest.mark.slow
def test_out_of_vocabulary_words_in_eval_sentences_are_named(tiny_run, tmp_path):
    shutil.copy(tiny_run.root / "mlflow.db", tmp_path / "mlflow.db")  # the session's store stays as it is
    proc = run_cli(tmp_path, f"run_id={tiny_run.runs[0].info.run_id}", "eval.size=8", "eval.counterfactual=false",
                   "eval.sentences=['s1 s2 s77 zz']", f"mlflow.tracking_uri={tracking_uri(tmp_path)}",
                   f"hydra.run.dir={tmp_path}/out", script=EVALUATE_PY, env=user_env(), timeout=300)
    assert proc.returncode == 0, explain(proc)
    [line] = [line for line in (proc.stdout + proc.stderr).splitlines() if "<unk>" in line]
    assert "s77" in line and "zz" in line and "s1 " not in line, line
