"""``translate.py`` through the real CLI, against a run trained to copy (conftest's ``copy_run``:
source lengths 1-5, exact match 1.000 within them, so its outputs are asserted literally): sources
from the command line and stdin, greedy and beam, the n best, the warning past the training lengths, the served
model's messages for a bad source, a bad run id, heatmap files; ``--help`` before the heavy imports."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from cli_helpers import TRANSLATE_PY, clean_env, explain, run_cli, user_env
from hydra import compose, initialize_config_dir

from attnseq.cli import overrides_and_texts
from attnseq.config import validate_translate
from attnseq.errors import ConfigError
from attnseq.evaluation.trained_runs import load_trained_run
from attnseq.evaluation.translate import LONGER_THAN_TRAINING
from attnseq.serving.predictor import DecodeLimit, InvalidSource, RequestLimits, Translator
from attnseq.tracking.client import TrackingClient

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def translate(copy_run, *args: str, stdin: str | None = "") -> subprocess.CompletedProcess:
    """``translate.py`` as a user runs it (no HYDRA_FULL_ERROR), on the copy run's store."""
    return run_cli(copy_run.root, f"mlflow.tracking_uri={copy_run.uri}", *args, script=TRANSLATE_PY,
                   env=user_env(), stdin=stdin)


def run_id(copy_run) -> str:
    return copy_run.runs[0].info.run_id


def test_a_source_past_the_training_lengths_is_translated_with_a_one_line_warning(copy_run):
    long_source = " ".join(f"s{i % 5}" for i in range(100))
    proc = translate(copy_run, f"run_id={run_id(copy_run)}", long_source, "s3 s1 s4")
    assert proc.returncode == 0, explain(proc)
    assert len(proc.stdout.splitlines()) == 2 and proc.stdout.splitlines()[1] == "s3 s1 s4"
    (warning,) = [line for line in proc.stderr.splitlines() if LONGER_THAN_TRAINING in line]
    assert "100" in warning and "1-5" in warning  # the source's length and the run's


def test_sources_are_read_from_stdin_a_line_each_and_latest_is_the_newest_run_and_beam_search_copies_too(copy_run):
    proc = translate(copy_run, "run_id=latest", "beam_size=2", stdin="s3 s1 s4\ns2 s2\n")
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.splitlines() == ["s3 s1 s4", "s2 s2"]
    assert run_id(copy_run) in proc.stderr  # which run "latest" was


def test_sources_on_the_command_line_are_copied_one_output_a_line_and_each_ones_heatmap_is_a_png(copy_run, tmp_path):
    proc = translate(copy_run, f"run_id={run_id(copy_run)}", f"heatmaps={tmp_path / 'maps'}", "s3 s1 s4",
                     "s0 s2 s4 s1")
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.splitlines() == ["s3 s1 s4", "s0 s2 s4 s1"]  # stdout holds the outputs alone
    assert LONGER_THAN_TRAINING not in proc.stderr and "Traceback" not in proc.stderr
    files = sorted((tmp_path / "maps").iterdir())
    assert [f.name for f in files] == ["source_0.png", "source_1.png"]
    assert all(f.read_bytes().startswith(PNG_MAGIC) for f in files)


@pytest.mark.parametrize("source", ["s3 q7 s4", "s1 " * 300], ids=["unknown token", "over max_source_tokens"])
def test_a_bad_source_gets_the_served_model_s_message_and_exit_2(copy_run, source):
    proc = translate(copy_run, f"run_id={run_id(copy_run)}", "s1 s2", source)
    assert proc.returncode == 2, explain(proc)
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    trained = load_trained_run(TrackingClient(copy_run.uri), copy_run.runs[0])
    served = Translator(trained.model, trained.src_vocab, trained.tgt_vocab, trained.src_tokenizer,
                        trained.tgt_tokenizer, DecodeLimit.of_config(trained.config), RequestLimits())
    with pytest.raises(InvalidSource) as caught:
        served.translate(["s1 s2", source])
    assert proc.stderr.strip() == f"error: {caught.value}"  # the one message, as the MLflow model words it


def test_a_run_id_the_store_does_not_hold_exits_2_with_one_message(copy_run):
    proc = translate(copy_run, "run_id=0123456789abcdef", "s1")
    assert proc.returncode == 2, explain(proc)
    assert proc.stderr.startswith("error: ") and "0123456789abcdef" in proc.stderr
    assert "Fix:" in proc.stderr and "Traceback" not in proc.stderr


def test_help_lists_the_keys_before_the_heavy_imports(tmp_path):
    proc = subprocess.run([sys.executable, "-X", "importtime", str(TRANSLATE_PY), "--help"], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, explain(proc)
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert not {"torch", "lightning", "mlflow", "numpy", "pandas"} & imported, imported
    for key in ("run_id", "beam_size", "n_best", "heatmaps", "mlflow.tracking_uri"):  # each with a meaning
        assert re.search(rf"^  {re.escape(key)} = \S+ +\S", proc.stdout, re.M), key
    assert "python translate.py run_id=" in proc.stdout  # the usage examples, from translate.yaml
    assert not list(tmp_path.iterdir())


def test_settings_and_sources_are_told_apart_and_after_dashes_all_are_sources():
    argv = ["run_id=abc", "s3 s1 s4", "+x.y=1", "~heatmaps", "--help", "s0", "--", "a=b c", "beam_size=2"]
    assert overrides_and_texts(argv) == (["run_id=abc", "+x.y=1", "~heatmaps", "--help"],
                                         ["s3 s1 s4", "s0", "a=b c", "beam_size=2"])


def test_n_best_prints_each_sources_best_outputs_a_line_each_the_first_its_output(copy_run):
    proc = translate(copy_run, f"run_id={run_id(copy_run)}", "beam_size=4", "n_best=3", "length_penalty=0.6",
                     "s3 s1 s4", "s2 s2")
    assert proc.returncode == 0, explain(proc)
    lines = [line.split("\t") for line in proc.stdout.splitlines()]
    assert [(row, output) for row, _, output in lines[::3]] == [("0", "s3 s1 s4"), ("1", "s2 s2")]  # it copies
    assert [row for row, _, _ in lines] == ["0"] * 3 + ["1"] * 3
    for source in (lines[:3], lines[3:]):
        scores = [float(score) for _, score, _ in source]
        assert scores == sorted(scores, reverse=True) and all(score < 0 for score in scores)
        assert len({output for _, _, output in source}) == 3  # three different outputs


@pytest.mark.parametrize(("overrides", "problem", "fix"), [
    (["beam_size=2", "n_best=3"], "n_best=3 is more than beam_size=2", "set beam_size=3 (or wider), or n_best=2."),
    (["n_best=0"], "n_best=0", "n_best=3"),
    (["n_best=17", "beam_size=16"], "n_best=17", "n_best=3"),
], ids=["over beam_size", "zero", "over the served model's max_beam_size"])
def test_a_bad_n_best_is_refused_with_a_fix(overrides, problem, fix):
    with initialize_config_dir(config_dir=str(TRANSLATE_PY.parent / "conf"), version_base="1.3"):
        cfg = compose("translate", overrides=["run_id=abc", *overrides])
    with pytest.raises(ConfigError) as caught:
        validate_translate(cfg)
    assert problem in caught.value.problem and fix in caught.value.fix, caught.value


def test_every_key_of_translate_yaml_is_a_declared_field():
    with initialize_config_dir(config_dir=str(TRANSLATE_PY.parent / "conf"), version_base="1.3"):
        typed = validate_translate(compose("translate", overrides=["run_id=abc"]))
    assert typed.run_id == "abc" and typed.beam_size == 1 and typed.n_best == 1 and typed.heatmaps is None
    assert not typed.model_extra and not typed.mlflow.model_extra
