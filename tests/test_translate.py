"""``translate.py`` through the real CLI, against a run trained to copy (conftest's ``copy_run``:
source lengths 1-5, exact match 1.000 within them, so its outputs are asserted literally): sources
from the command line and stdin, greedy and beam, the n best, the warning past the training lengths, the served
model's messages for a bad source, a bad run id, heatmap files; ``--help`` before the heavy imports."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from cli_helpers import TRANSLATE_PY, clean_env, explain, run_cli, user_env
from hydra import compose, initialize_config_dir
from model_checks import stand_in_run

from attnseq.cli import overrides_and_texts
from attnseq.config import validate_translate
from attnseq.data.vocab import BOS_TOKEN, PAD
from attnseq.errors import ConfigError
from attnseq.evaluation.trained_runs import load_trained_run
from attnseq.evaluation.translate import LONGER_THAN_TRAINING, heatmap_figures
from attnseq.model import decoder_inputs, greedy_decode
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


# -- a self-attending model's figures, in-process --------------------------------------------------
def heatmap_config(tmp_path, beam_size: int = 1):
    with initialize_config_dir(config_dir=str(TRANSLATE_PY.parent / "conf"), version_base="1.3"):
        return validate_translate(compose("translate", overrides=["run_id=abc", f"beam_size={beam_size}",
                                                                  f"heatmaps={tmp_path / 'maps'}"]))


def drawn_panels(figure) -> list:
    """The figure's heatmap panels, in reading order: (title, matrix, x tick labels, y tick labels)."""
    return [(ax.get_title(), np.asarray(ax.images[0].get_array()), [t.get_text() for t in ax.get_xticklabels()],
             [t.get_text() for t in ax.get_yticklabels()]) for ax in figure.axes if ax.images]


def test_a_transformers_heatmap_comes_with_each_stacks_self_attention_of_the_same_decoding(tmp_path):
    """``heatmaps=maps/``: beside ``source_0.png``, ``self_attention/encoder_source_0.png`` and
    ``decoder_source_0.png``, each a row per layer (the head mean, then each head) holding the maps
    ``Seq2Seq.self_attention`` gives for the source in a padded batch of two and the output greedy decoding
    gives for it alone, cut to the source's and the output's lengths."""
    trained = stand_in_run("enc-dec")
    translator = Translator(trained.model, trained.src_vocab, trained.tgt_vocab, None, None, DecodeLimit())
    source = ["s3", "s1", "s4", "s0", "s2"]
    ids = trained.src_vocab.encode(source)
    path = tmp_path / "maps" / "source_0.png"
    figures = heatmap_figures(translator, trained, " ".join(source), ids, "out", heatmap_config(tmp_path), path)
    beside = tmp_path / "maps" / "self_attention"
    assert list(figures) == [path, beside / "encoder_source_0.png", beside / "decoder_source_0.png"]

    with torch.no_grad():
        decoded = greedy_decode(trained.model, torch.tensor([ids]), torch.tensor([len(ids)]),
                                max_length=DecodeLimit()(len(ids)))
        n_out = int(decoded.lengths[0])
        outputs = decoded.tokens[:, :n_out]  # (1, T_out)
        src = torch.tensor([ids, [*ids[:2], PAD, PAD, PAD]])  # (2, T_src): the source, and a shorter one
        tgt_in = torch.cat([decoder_inputs(outputs), torch.full((1, n_out), PAD)])  # (2, T_out)
        maps = trained.model.self_attention(src, torch.tensor([len(ids), 2]), tgt_in)
    out_tokens = trained.tgt_vocab.decode(outputs[0].tolist())
    expected = {"encoder": ([m[0, :, :len(ids), :len(ids)] for m in maps.encoder], source, source),
                "decoder": ([m[0, :, :n_out, :n_out] for m in maps.decoder], [BOS_TOKEN, *out_tokens[:-1]],
                            out_tokens)}
    assert drawn_panels(figures[path])[0][3] == out_tokens  # the cross-attention's rows: the same output
    for stack, (layers, keys, queries) in expected.items():
        panels = drawn_panels(figures[beside / f"{stack}_source_0.png"])
        heads = len(layers[0])  # the encoder's 2, the decoder's 3
        assert len(layers) == 2 and len(panels) == 2 * (1 + heads)  # a row per layer: the mean, each head
        for layer, weights in enumerate(layers):
            row = panels[layer * (1 + heads):(layer + 1) * (1 + heads)]
            assert row[0][0] == f"layer {layer + 1}, mean over heads"
            for (_, drawn, x, y), matrix in zip(row, [weights.mean(0), *weights]):  # (n, n) each
                np.testing.assert_allclose(drawn, matrix.numpy(), atol=1e-6)
                assert x == keys and y == queries


def test_an_rnn_models_heatmap_is_drawn_alone(tmp_path):
    trained = stand_in_run("gru", encoder="gru", decoder="bahdanau")
    translator = Translator(trained.model, trained.src_vocab, trained.tgt_vocab, None, None, DecodeLimit())
    ids = trained.src_vocab.encode(["s1", "s2"])
    path = tmp_path / "maps" / "source_0.png"
    assert list(heatmap_figures(translator, trained, "s1 s2", ids, "out", heatmap_config(tmp_path, 2), path)) == [path]
