"""``evaluate.py`` through the real CLI on runs trained tiny in ``tmp_path``: evaluation runs
nested under the evaluated runs, a metric for every bucket, the artifacts, the side-by-side
comparison, and clear errors for runs that cannot be evaluated; in-process, the n best with a
length penalty."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from cli_helpers import (  # noqa: E402  (tests/ is on sys.path under pytest)
    EVALUATE_PY,
    EXPERIMENT,
    all_runs,
    artifact_paths,
    explain,
    outputs_under,
    run_cli,
    tiny,
    tracking_uri,
    user_env,
)
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from attnseq.attention import NO_ATTENTION
from attnseq.data import Example, Vocabulary
from attnseq.errors import ConfigError
from attnseq.evaluation.compare import Compared
from attnseq.evaluation.pipeline import GROUPS_PARAM, same_sample_figure
from attnseq.evaluation.trained_runs import named_experiment
from attnseq.metrics import DIAGNOSTICS
from attnseq.metrics.declarations import SuiteSpec, names
from attnseq.metrics.faithfulness import FaithSettings
from attnseq.model import ModelConfig
from attnseq.model.decoding import Decoded
from attnseq.tracking.client import TrackingClient
from attnseq.tracking.explorer import explorer_data
from attnseq.tracking.paths import EXPLORER

EVAL_LENGTHS = (1, 14)  # past the tiny runs' training lengths (1-6)
WIDTH = 5
SENTENCES = ("s1 s2 s3", "s4 s0 s4 s9")  # eval.sentences: the copy task's source text is its symbols
SCORERS = (NO_ATTENTION, ModelConfig.scorer)
"""The fixed-vector baseline and the default scorer: the pair the README compares first."""
FAITH = ("faith.samples=2", "faith.ig_steps=4", "faith.adversarial=null")
"""A cheap faithfulness probe: the three measures' τ and the flip rates on 2 sequences, no adversarial search."""


def expected_buckets(lo_hi=EVAL_LENGTHS, width=WIDTH) -> list[str]:
    """Written here from the definition: 01-05, 06-10, 11-14."""
    hi = lo_hi[1]
    return [f"{lo:02d}-{min(lo + width - 1, hi):02d}" for lo in range(1, hi + 1, width)]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    trained = run_cli(root, "-m", f"scorer={','.join(SCORERS)}", *tiny(heatmaps=False),
                      *outputs_under(root, seeded=True))
    assert trained.returncode == 0, explain(trained)
    client = MlflowClient(tracking_uri(root))
    [parent] = [r for r in all_runs(client) if MLFLOW_PARENT_RUN_ID not in r.data.tags]
    proc = run_cli(
        root, f"parent_run_id={parent.info.run_id}", f"eval.lengths=[{EVAL_LENGTHS[0]},{EVAL_LENGTHS[1]}]",
        "eval.size=120", f"mlflow.tracking_uri={tracking_uri(root)}", f"hydra.run.dir={root}/eval",
        f"eval.sentences=[{','.join(repr(text) for text in SENTENCES)}]", *FAITH, script=EVALUATE_PY,
    )
    assert proc.returncode == 0, explain(proc)
    runs = all_runs(client)
    return {
        "root": root, "client": client, "parent": parent, "stdout": proc.stdout,
        "train": {r.data.params["scorer.name"]: r for r in runs if r.data.tags.get("attnseq.kind") == "train"},
        "eval": [r for r in runs if r.data.tags.get("attnseq.kind") == "eval"],
        "comparison": [r for r in runs if r.data.tags.get("attnseq.kind") == "comparison"],
    }


@pytest.mark.slow
def test_one_evaluation_run_nested_under_each_evaluated_run(evaluated):
    assert len(evaluated["eval"]) == len(SCORERS)
    train_ids = {r.info.run_id for r in evaluated["train"].values()}
    assert {r.data.tags[MLFLOW_PARENT_RUN_ID] for r in evaluated["eval"]} == train_ids
    assert all(r.info.status == "FINISHED" for r in evaluated["eval"])


@pytest.mark.parametrize("scorer", SCORERS)
def test_evaluation_metrics_cover_every_bucket(evaluated, scorer):
    train_id = evaluated["train"][scorer].info.run_id
    [run] = [r for r in evaluated["eval"] if r.data.tags[MLFLOW_PARENT_RUN_ID] == train_id]
    metrics = run.data.metrics
    for name in expected_buckets():
        assert 0.0 <= metrics[f"eval/acc_len/{name}"] <= 1.0
        assert 0.0 <= metrics[f"eval/exact_len/{name}"] <= 1.0
    assert {"eval/acc", "eval/exact_match", "eval/acc_train_lengths", "eval/exact_match_train_lengths"} <= set(metrics)
    if scorer == "none":  # nothing to align or to replace
        assert not any(k.startswith(("eval/align", "eval/attn_", "eval/aer", "eval/cf_")) for k in metrics)
    else:
        assert {"eval/cf_permute_flip_rate", "eval/cf_uniform_tv"} <= set(metrics)
        # precision needs at least one confident link, which a barely trained model may not make
        always = [d for d in DIAGNOSTICS if d != "align_precision"]
        assert {f"eval/{d}" for d in always} <= set(metrics)
        assert {f"eval/{d}_train_lengths" for d in always} <= set(metrics)
        for name in expected_buckets():
            assert 0.0 <= metrics[f"eval/cf_uniform_flip_len/{name}"] <= 1.0
            assert 0.0 <= metrics[f"eval/align_acc_len/{name}"] <= metrics[f"eval/align_acc_near_len/{name}"] <= 1.0
            assert abs(metrics[f"eval/align_offset_len/{name}"]) < EVAL_LENGTHS[1]
            assert 0.0 <= metrics[f"eval/attn_margin_len/{name}"] <= 1.0
    assert run.data.params["eval.lengths"] == str(EVAL_LENGTHS)
    uppers = [int(name.split("-")[1]) for name in expected_buckets()]  # 5, 10, 14
    client = evaluated["client"]
    for curve, per_bucket in (("eval/acc_by_length", "eval/acc_len"), ("eval/exact_by_length", "eval/exact_len")):
        points = {m.step: m.value for m in client.get_metric_history(run.info.run_id, curve)}
        assert points == {hi: pytest.approx(metrics[f"{per_bucket}/{name}"])
                          for hi, name in zip(uppers, expected_buckets())}


@pytest.mark.parametrize("scorer", SCORERS)
def test_evaluation_artifacts(evaluated, scorer):
    client = evaluated["client"]
    train_id = evaluated["train"][scorer].info.run_id
    [run] = [r for r in evaluated["eval"] if r.data.tags[MLFLOW_PARENT_RUN_ID] == train_id]
    paths = artifact_paths(client, run.info.run_id)
    assert {"eval/buckets.json", "eval/buckets.csv", "figures/accuracy_vs_length.png"} <= paths
    local = client.download_artifacts(run.info.run_id, "eval/buckets.csv", str(evaluated["root"] / scorer))
    rows = list(csv.DictReader(open(local)))
    assert [f"{int(r['lo']):02d}-{int(r['hi']):02d}" for r in rows] == expected_buckets()
    assert sum(int(r["sequences"]) for r in rows) == 120
    if scorer != "none":
        assert all(r["align_acc"] != "" and r["attn_entropy"] != "" for r in rows)
        assert "figures/counterfactual.png" in paths
        assert len([p for p in paths if p.startswith("heatmaps/long_")]) == 3
        page = client.download_artifacts(run.info.run_id, EXPLORER, str(evaluated["root"] / scorer))
        [epoch] = explorer_data(Path(page).read_text(encoding="utf-8"))["epochs"]
        lengths = [len(sample["source"]) for sample in epoch["samples"]]
        assert len(lengths) == 4 and lengths == sorted(lengths) and lengths[-1] > lengths[0]  # spread over lengths
        assert all(set(sample["importance"]) == {"grad_x_input", "integrated_gradients", "leave_one_out"}
                   and sample["gold"] is not None for sample in epoch["samples"])  # copy: a gold alignment
    else:
        assert EXPLORER not in paths  # no attention to explore


def test_named_sentences_are_decoded_and_drawn(evaluated):
    """eval.sentences: each text's heatmap on the attending run's evaluation, its axes the text's tokens
    and the tokens the run's own model decodes from them (decoded here independently of evaluation)."""
    import matplotlib.image

    from attnseq.evaluation.trained_runs import load_trained_run
    from attnseq.model import greedy_decode
    from attnseq.tracking.client import TrackingClient

    client = evaluated["client"]
    trained_run = evaluated["train"][ModelConfig.scorer]
    [run] = [r for r in evaluated["eval"] if r.data.tags[MLFLOW_PARENT_RUN_ID] == trained_run.info.run_id]
    heatmaps = sorted(p for p in artifact_paths(client, run.info.run_id) if p.startswith("heatmaps/sentence_"))
    assert heatmaps == [f"heatmaps/sentence_{i}.png" for i in range(len(SENTENCES))]
    image = matplotlib.image.imread(client.download_artifacts(run.info.run_id, heatmaps[1], str(evaluated["root"])))
    assert image.ndim == 3 and image.shape[0] > 100 and image.std() > 0  # a drawn figure, not a blank
    [none_run] = [r for r in evaluated["eval"]
                  if r.data.tags[MLFLOW_PARENT_RUN_ID] == evaluated["train"][NO_ATTENTION].info.run_id]
    assert not any(p.startswith("heatmaps/sentence_") for p in artifact_paths(client, none_run.info.run_id))

    from attnseq.evaluation.evaluator import sentence_samples

    trained = load_trained_run(TrackingClient(client.tracking_uri), trained_run)
    samples = sentence_samples(trained, SENTENCES, beam_size=1)
    for text, (read, example, decoded) in zip(SENTENCES, samples):
        assert read == text and example.src == text.split()
        src = torch.tensor([trained.src_vocab.encode(text.split())])  # (1, T_src)
        alone = greedy_decode(trained.model, src, torch.tensor([src.shape[1]]), max_length=int(decoded.lengths))
        n = int(alone.lengths[0])
        assert decoded.tokens.tolist() == alone.tokens[0, :n].tolist()
        weights = decoded.attention[:, :, : len(example.src)]  # (H, T_out, T_src): less the batch's padding
        assert decoded.attention[:, :, len(example.src):].abs().sum() == 0  # padding never attended
        torch.testing.assert_close(weights, alone.attention[0, :, :n])


def test_comparison_has_one_row_per_run_and_a_figure(evaluated):
    """One seed per scorer: each run is its own group, labelled by what varied, without an interval."""
    [comparison] = evaluated["comparison"]
    client = evaluated["client"]
    assert comparison.data.tags[MLFLOW_PARENT_RUN_ID] == evaluated["parent"].info.run_id
    paths = artifact_paths(client, comparison.info.run_id)
    assert {"comparison/comparison.png", "comparison/comparison.md", "comparison/comparison.csv",
            "comparison/comparison_runs.csv"} <= paths
    local = client.download_artifacts(comparison.info.run_id, "comparison/comparison.csv", str(evaluated["root"]))
    rows = list(csv.DictReader(open(local)))
    assert sorted(r["scorer"] for r in rows) == sorted(SCORERS)
    assert sorted(r["group"] for r in rows) == sorted(f"scorer={s}" for s in SCORERS)  # labelled by what varied
    assert all(r["n_seeds"] == "1" for r in rows)
    assert all(int(r["params"]) > 0 for r in rows)
    assert all(r["eval/acc_ci95"] == "" and 0.0 <= float(r["eval/acc_mean"]) <= 1.0 for r in rows)
    assert [c.removesuffix("_mean") for c in rows[0] if c.startswith("acc/") and c.endswith("_mean")] == [
        f"acc/{name}" for name in expected_buckets()
    ]
    assert comparison.data.params[GROUPS_PARAM] == "; ".join(r["group"] for r in rows)
    for scorer in SCORERS:
        assert 0.0 <= comparison.data.metrics[f"eval/acc/scorer_{scorer}"] <= 1.0
    # the eval/faith/... columns: the names the metric registry declares for the attending run's evaluation
    spec = SuiteSpec("eval", max_length=EVAL_LENGTHS[1], bucket_width=WIDTH, train_lengths=(1, 6), attention=True,
                     gold_alignment=True, text=False,
                     faith=FaithSettings(samples=2, adversarial=None).groups())
    declared = names(spec, needs_faith=True)
    assert "eval/faith/leave_one_out/tau" in declared and "eval/faith/cf_uniform_flip_rate_len/01-05" in declared
    assert sorted(c for c in rows[0] if c.startswith("eval/faith/")) == sorted(
        f"{name}{suffix}" for name in declared for suffix in ("_mean", "_ci95"))
    by_scorer = {r["scorer"]: r for r in rows}
    assert 0.0 <= float(by_scorer[ModelConfig.scorer]["eval/faith/cf_uniform_flip_rate_mean"]) <= 1.0
    assert all(by_scorer[NO_ATTENTION][c] == "" for c in rows[0] if c.startswith("eval/faith/"))  # nothing to probe
    assert 0.0 <= comparison.data.metrics[f"eval/faith/cf_uniform_flip_rate/scorer_{ModelConfig.scorer}"] <= 1.0
    # readable without the UI: the terminal shows the same table
    assert "| scorer=additive | 1 |" in evaluated["stdout"] and "| scorer=none | 1 |" in evaluated["stdout"]
    # significance: every pair of scorers, paired on the same 120 sequences (one seed: no Welch)
    assert {"comparison/significance.csv", "comparison/significance.md", "comparison/significance.png"} <= paths
    local = client.download_artifacts(comparison.info.run_id, "comparison/significance.csv", str(evaluated["root"]))
    tests = list(csv.DictReader(open(local)))
    assert len(tests) == len(SCORERS) * (len(SCORERS) - 1) // 2 * 2  # each pair: accuracy and exact match
    for row in tests:
        assert row["paired_runs"] == "1" and row["sequences"] == "120" and row["p_welch"] == ""
        assert 0 < float(row["p_bootstrap"]) <= 1
        assert float(row["paired_a"]) == pytest.approx(float(row["mean_a"]), abs=1e-6)  # the outcomes are eval/'s


def test_a_piped_evaluation_prints_a_line_per_run_and_no_progress_bar_frames(evaluated):
    """stdout is a pipe here, as in `evaluate.py ... | tee eval.log`: each run is announced on a line
    of its own before its result line, in order, and no bar's carriage-return frame is left in the log."""
    stdout = evaluated["stdout"]
    assert "\r" not in stdout and "\x1b[" not in stdout
    lines = stdout.splitlines()
    names = [r.info.run_name for r in evaluated["train"].values()]
    for name in names:
        announced = [i for i, line in enumerate(lines) if line.startswith("[") and f"] {name}: " in line]
        finished = [i for i, line in enumerate(lines) if line.startswith(f"{name}: eval acc ")]
        assert len(announced) == 1 and len(finished) == 1 and announced[0] < finished[0], (name, stdout[-2000:])
    counters = [line.split("]")[0] for line in lines if line.startswith("[") and "] " in line]
    assert counters == [f"[{i}/{len(names)}" for i in range(1, len(names) + 1)]


def test_evaluation_rebuilds_the_model_from_the_run_alone(evaluated):
    """The evaluated model is the saved one: its eval accuracy is reproducible in-process; a run
    trained without average.k has no averaged model to rebuild."""
    from attnseq.errors import ConfigError
    from attnseq.evaluation.evaluator import EvalSettings, evaluate_run
    from attnseq.evaluation.trained_runs import load_trained_run
    from attnseq.tracking.client import TrackingClient

    client = evaluated["client"]
    run = evaluated["train"]["additive"]
    trained = load_trained_run(TrackingClient(client.tracking_uri), run)
    saved = torch.load(client.download_artifacts(run.info.run_id, "weights/model.pt", str(evaluated["root"] / "m")),
                       weights_only=True)
    assert trained.model.config.scorer == saved["model_config"]["scorer"] == "additive"
    result = evaluate_run(trained, EvalSettings(EVAL_LENGTHS, WIDTH, size=120, counterfactual=False, seed=1))
    [logged] = [r for r in evaluated["eval"] if r.data.tags[MLFLOW_PARENT_RUN_ID] == run.info.run_id]
    assert result.metrics["eval/acc"] == pytest.approx(logged.data.metrics["eval/acc"])
    with pytest.raises(ConfigError) as caught:  # trained without average.k: no averaged model to evaluate
        load_trained_run(TrackingClient(client.tracking_uri), run, "averaged_model")
    assert "no averaged model" in caught.value.problem and "model=model" in caught.value.fix


def test_the_n_best_keep_the_metrics_of_the_best_and_list_each_examples_ranked_by_the_penalised_score(tiny_run):
    """In-process on the session's tiny run: eval.n_best=3 decodes what n_best=1 does (the same metrics
    and outputs), and each example's rows hold its three best, the first its output, ranked by
    log p / lp(length) with the α given."""
    from attnseq.data.tokenizers import output_text
    from attnseq.evaluation.evaluator import N_BEST_COLUMNS, EvalSettings, evaluate_run, evaluation_examples
    from attnseq.evaluation.trained_runs import load_trained_run
    from attnseq.model.beam import length_penalty_factor
    from attnseq.tracking.client import TrackingClient

    trained = load_trained_run(TrackingClient(tiny_run.uri), tiny_run.runs[0])
    settings = dict(lengths=(1, 8), bucket_width=WIDTH, size=40, batch_size=16, beam_size=4, length_penalty=0.6,
                    counterfactual=False, seed=1)
    examples = evaluation_examples(trained, EvalSettings(**settings))
    one = evaluate_run(trained, EvalSettings(**settings), examples)
    three = evaluate_run(trained, EvalSettings(**settings, n_best=3), examples)
    assert three.metrics == one.metrics and three.predictions == one.predictions and one.n_best == []
    rows = three.n_best
    assert [(row["example"], row["rank"]) for row in rows] == [(i, k) for i in range(40) for k in (1, 2, 3)]
    assert all(list(row) == list(N_BEST_COLUMNS) for row in rows)
    for i, example in enumerate(examples):
        best = rows[3 * i : 3 * i + 3]
        assert best[0]["output"] == output_text(one.predictions[i], trained.tgt_vocab, trained.tgt_tokenizer)
        assert {row["source"] for row in best} == {" ".join(example.src)}
        assert {row["reference"] for row in best} == {" ".join(example.tgt)}
        scores = [row["score"] for row in best]
        assert scores == sorted(scores, reverse=True)
        for row in best:
            assert row["score"] == pytest.approx(row["log_prob"] / length_penalty_factor(row["length"], 0.6))


# -- errors ------------------------------------------------------------------------------------
def test_a_run_id_that_does_not_exist_is_a_clear_error(evaluated):
    root = evaluated["root"]
    proc = run_cli(root, "run_id=0123456789abcdef", f"mlflow.tracking_uri={tracking_uri(root)}",
                   f"hydra.run.dir={root}/bad", script=EVALUATE_PY)
    assert proc.returncode != 0
    assert "0123456789abcdef" in proc.stderr and "Fix:" in proc.stderr
    assert not (root / "bad").exists()  # told before Hydra makes the run folder: nothing left on disk


def test_a_misspelt_experiment_name_is_told_with_the_stores_experiments_and_the_closest(evaluated):
    root = evaluated["root"]
    proc = run_cli(root, f"experiment_name={EXPERIMENT[:-1]}", f"mlflow.tracking_uri={tracking_uri(root)}",
                   f"hydra.run.dir={root}/bad-name", script=EVALUATE_PY, env=user_env())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, explain(proc)
    assert f"Fix: experiment_name={EXPERIMENT}" in proc.stderr, explain(proc)
    assert not (root / "bad-name").exists()
    with pytest.raises(ConfigError) as raised:  # nothing close: the names it holds, and where to look
        named_experiment(TrackingClient(tracking_uri(root)), "zzzz")
    assert repr(EXPERIMENT) in raised.value.problem and "mlflow.tracking_uri" in raised.value.fix


def test_a_store_that_is_not_there_is_told_and_not_created(tmp_path):
    """A SQLite URI naming no file is a wrong URI for a command that reads runs: told before Hydra's run
    folder, and no empty store is left behind."""
    missing = tmp_path / "typo.db"
    proc = run_cli(tmp_path, "experiment_name=attnseq", f"mlflow.tracking_uri=sqlite:///{missing}",
                   f"hydra.run.dir={tmp_path}/out", script=EVALUATE_PY, env=user_env())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, explain(proc)
    assert str(missing) in proc.stderr and "Fix:" in proc.stderr, explain(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], explain(proc)


@pytest.mark.slow
def test_a_run_without_a_model_is_a_clear_error(evaluated):
    root, client = evaluated["root"], evaluated["client"]
    parent_id = evaluated["parent"].info.run_id  # the sweep's parent holds no model
    proc = run_cli(root, f"run_id={parent_id}", f"mlflow.tracking_uri={tracking_uri(root)}",
                   f"hydra.run.dir={root}/bad2", script=EVALUATE_PY)
    assert proc.returncode != 0
    assert parent_id in proc.stderr and "model" in proc.stderr and "Fix:" in proc.stderr
    assert client.get_run(parent_id).info.status == "FINISHED"  # untouched


@pytest.mark.slow
def test_latest_sweep_is_resolved_for_the_comparison_too(evaluated):
    """``parent_run_id=latest`` puts the comparison run under the sweep itself, never under a
    literal parent id "latest" (an orphan the MLflow UI cannot place). Runs last: it adds runs."""
    root, client = evaluated["root"], evaluated["client"]
    proc = run_cli(
        root, "parent_run_id=latest", "eval.lengths=[1,8]", "eval.size=40", "eval.counterfactual=false",
        f"mlflow.tracking_uri={tracking_uri(root)}", f"hydra.run.dir={root}/eval-latest", script=EVALUATE_PY,
    )
    assert proc.returncode == 0, explain(proc)
    comparisons = [r for r in all_runs(client) if r.data.tags.get("attnseq.kind") == "comparison"]
    newest = max(comparisons, key=lambda r: r.info.start_time)
    assert newest.data.tags[MLFLOW_PARENT_RUN_ID] == evaluated["parent"].info.run_id


def compared(name: str, samples: list[tuple[list[str], int]]) -> Compared:
    """A stand-in evaluated run whose heatmap samples are ``(source, decoded length)`` pairs."""
    vocab = Vocabulary(["a", "b", "c"])
    long_samples = []
    for src, n_out in samples:
        attention = torch.full((2, n_out, len(src) + 1), 1.0 / len(src))  # (H, T_out, T_enc): one pad column
        long_samples.append((Example(src, src), Decoded(torch.full((n_out,), vocab.encode(["a"])[0]), n_out,
                                                        attention)))
    trained = type("Trained", (), {"name": name, "tgt_vocab": vocab})()
    return Compared(trained, type("Result", (), {"long_samples": long_samples})())


def test_same_sample_heatmaps_put_one_shared_sequence_side_by_side():
    shared, longer = ["a", "b", "c", "a"], ["c", "b", "a", "c", "b"]
    figure = same_sample_figure([compared("gru", [(["a"], 1), (shared, 3), (longer, 5)]),
                                 compared("none", []),  # no attention: no panel
                                 compared("lstm", [(shared, 4), (longer, 2)])])
    heatmaps = [ax for ax in figure.axes if ax.get_images()]
    assert [ax.get_title() for ax in heatmaps] == ["gru", "lstm"]
    assert [ax.get_images()[0].get_array().shape for ax in heatmaps] == [(5, 5), (2, 5)]  # the longest shared
    assert [t.get_text() for t in heatmaps[0].get_xticklabels()] == longer
    assert "source length 5" in figure.texts[0].get_text()


def test_no_same_sample_figure_without_two_runs_sharing_a_sequence():
    assert same_sample_figure([compared("gru", [(["a", "b"], 2)]), compared("lstm", [(["b", "a"], 2)])]) is None
    assert same_sample_figure([compared("gru", [(["a", "b"], 2)]), compared("none", [])]) is None


def test_named_sentences_side_by_side_one_panel_per_attending_run_labelled_by_group():
    from types import SimpleNamespace

    from attnseq.evaluation.pipeline import same_sentence_figures

    vocab = Vocabulary(["la", "nom"])

    def member(seed, sentences):
        samples = [(text, Example(text.split(), []), Decoded(torch.tensor(vocab.encode(["nom", "la"])), 2,
                                                            torch.full((1, 2, len(text.split()) + 1), 0.5)))
                   for text in sentences]
        return SimpleNamespace(seed=seed, trained=SimpleNamespace(tgt_vocab=vocab),
                               result=SimpleNamespace(sentence_samples=samples))

    texts = ["register name", "max size"]
    groups = [SimpleNamespace(name="scorer=additive", members=[member(0, texts), member(1, texts)]),
              SimpleNamespace(name="scorer=none", members=[member(0, [])]),  # no attention: no panel
              SimpleNamespace(name="scorer=general", members=[member(0, texts)])]
    figures = same_sentence_figures(groups)
    assert len(figures) == 2
    for figure, text in zip(figures, texts):
        heatmaps = [ax for ax in figure.axes if ax.get_images()]
        assert [ax.get_title() for ax in heatmaps] == ["scorer=additive, seed 0", "scorer=additive, seed 1",
                                                       "scorer=general"]
        assert [t.get_text() for t in heatmaps[0].get_xticklabels()] == text.split()
        assert [t.get_text() for t in heatmaps[0].get_yticklabels()] == ["nom", "la"]
        assert repr(text) in figure.texts[0].get_text()
    assert same_sentence_figures(groups[:2][1:]) == []  # one run or none attending: nothing side by side


# -- a subword run on a corpus folder ------------------------------------------------------------
NOUNS = [("cat", "chat"), ("dog", "chien"), ("house", "maison"), ("file", "fichier"), ("window", "fenêtre"),
         ("tree", "arbre"), ("car", "voiture"), ("book", "livre")]
ADJECTIVES = [("red", "rouge"), ("big", "grand"), ("small", "petit"), ("green", "vert"), ("old", "vieux"),
              ("new", "nouveau")]
TEMPLATES = [("The {a} {n} is here.", "Le {n} {a} est là."), ("Open the {a} {n} in @1", "Ouvrir le {n} {a} dans @1"),
             ("Don't close the {a} {n}!", "Ne fermez pas le {n} {a} « maintenant » !")]


def subword_corpus(folder):
    """English → French-like pairs (adjective after the noun), split by pair into train/val/test.tsv."""
    pairs = [(en.format(a=a_en, n=n_en), fr.format(a=a_fr, n=n_fr))
             for en, fr in TEMPLATES for n_en, n_fr in NOUNS for a_en, a_fr in ADJECTIVES]
    folder.mkdir()
    splits = {"val": pairs[0::6], "test": pairs[1::6], "train": [p for i, p in enumerate(pairs) if i % 6 > 1]}
    for split, chosen in splits.items():
        (folder / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in chosen), encoding="utf-8")
    return splits


@pytest.fixture(scope="module")
def subword_run(tmp_path_factory):
    """A bpe run whose output layer is tied to the target embedding (Bahdanau's readout: through a projection)."""
    root = tmp_path_factory.mktemp("subwords")
    splits = subword_corpus(root / "corpus")
    trained = run_cli(
        root, "dataset=tsv", f"dataset.path={root / 'corpus'}", "dataset.tokenizer=bpe", "dataset.vocab_size=120",
        "dataset.train_lengths=[1,30]", "dataset.eval_lengths=[1,30]", "dataset.bucket_width=10",
        "model.hidden_size=16", "model.embedding_dim=8", "model.tie_output=true", "trainer.max_epochs=2",
        "trainer.enable_progress_bar=false", "training.val_text_scores=[sacrebleu,chrf,ter]",
        "trainer.enable_model_summary=false", "tracking.heatmap_samples=1", *outputs_under(root, seeded=True),
    )
    assert trained.returncode == 0, explain(trained)
    client = MlflowClient(tracking_uri(root))
    [run] = all_runs(client)
    evaluated = run_cli(root, f"run_id={run.info.run_id}", "eval.lengths=[1,30]", "eval.size=1000",
                        f"mlflow.tracking_uri={tracking_uri(root)}", f"hydra.run.dir={root}/eval", script=EVALUATE_PY)
    assert evaluated.returncode == 0, explain(evaluated)
    [evaluation] = [r for r in all_runs(client) if r.data.tags.get("attnseq.kind") == "eval"]
    return {"root": root, "client": client, "run": client.get_run(run.info.run_id), "eval": evaluation,
            "splits": splits}


@pytest.mark.slow
def test_a_subword_run_saves_its_tokenizers_and_scores_with_their_signatures(subword_run):
    import sacrebleu
    from tokenizers import Tokenizer

    client, run = subword_run["client"], subword_run["run"]
    assert {"vocab/src_tokenizer.json", "vocab/tgt_tokenizer.json"} <= artifact_paths(client, run.info.run_id)
    local = client.download_artifacts(run.info.run_id, "vocab/src_tokenizer.json", str(subword_run["root"] / "tok"))
    pieces = Tokenizer.from_file(local).encode("Open the red cat in @1").tokens  # the library reads it alone
    assert pieces[0].startswith("\u2581") and "".join(pieces).replace("\u2581", " ").strip() == "open the red cat in @1"
    for key in ("val/sacrebleu", "val/chrf", "val/ter"):
        assert len(client.get_metric_history(run.info.run_id, key)) == 2  # each validation epoch
        assert 0.0 <= run.data.metrics[key] <= (100.0 if key != "val/ter" else 1000.0)  # TER: edits per 100 words
    bleu = f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    for logged in (run, subword_run["eval"]):
        assert logged.data.params["sacrebleu.signature"] == bleu
        assert logged.data.params["chrf.signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no")
        assert logged.data.params["ter.signature"].startswith("nrefs:1|case:lc|tok:tercom|norm:no|punct:yes")
    assert "eval/bleu" not in subword_run["eval"].data.metrics


def decoded_alone(trained, pieces: list[str], limit: int) -> str:
    """One source's greedy output, decoded by the model library alone and detokenised by Hugging Face's
    own Metaspace decoder: independent of attnseq's serving and scoring code."""
    from tokenizers import decoders

    from attnseq.model import greedy_decode

    src = torch.tensor([trained.src_vocab.encode(pieces)])  # (1, T_src)
    decoded = greedy_decode(trained.model, src, torch.tensor([len(pieces)]), max_length=limit)
    words = trained.tgt_vocab.decode(decoded.tokens[0, : int(decoded.lengths[0])].tolist())
    words = words[: words.index("</s>")] if "</s>" in words else words
    return decoders.Metaspace(replacement="\u2581", prepend_scheme="always").decode(words)


@pytest.mark.slow
def test_a_subword_runs_mlflow_model_outputs_detokenised_text_that_evaluation_scores(subword_run):
    """The MLflow model (tied) reads raw text with the run's tokenizer and detokenises its output; eval/sacrebleu,
    eval/chrf and eval/ter are sacrebleu's own scores of the test outputs (one batch: one length limit for all)."""
    import mlflow.pyfunc
    import pandas as pd
    import sacrebleu
    from tokenizers import Tokenizer

    from attnseq.evaluation.trained_runs import load_trained_run
    from attnseq.tracking.client import TrackingClient
    from attnseq.tracking.logged_model import logging_scope

    client, run, evaluation = subword_run["client"], subword_run["run"], subword_run["eval"]
    test = subword_run["splits"]["test"]
    trained = load_trained_run(TrackingClient(client.tracking_uri), run)
    assert trained.model.decoder.readout.output.weight is trained.model.decoder.embedding.weight  # tied
    reader = Tokenizer.from_file(client.download_artifacts(run.info.run_id, "vocab/src_tokenizer.json",
                                                           str(subword_run["root"] / "reader")))
    pieces = [reader.encode(source).tokens for source, _ in test]
    ratio, extra = trained.config["decode"]["max_length_ratio"], trained.config["decode"]["max_length_extra"]

    with logging_scope(client):
        model = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    outputs = model.predict(pd.DataFrame({"source": [source for source, _ in test]}))["output"].tolist()
    assert outputs == [decoded_alone(trained, p, int(len(p) * ratio) + extra) for p in pieces]
    assert all("\u2581" not in text for text in outputs)

    limit = int(max(len(p) for p in pieces) * ratio) + extra
    hypotheses = [decoded_alone(trained, p, limit) for p in pieces]
    references = [target.lower() for _, target in test]  # the run lowercases
    metrics = evaluation.data.metrics
    assert metrics["eval/sacrebleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert metrics["eval/chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    assert metrics["eval/ter"] == pytest.approx(sacrebleu.corpus_ter(hypotheses, [references]).score)
    local = client.download_artifacts(evaluation.info.run_id, "eval/buckets.csv", str(subword_run["root"] / "b"))
    rows = list(csv.DictReader(open(local)))
    assert [f"{int(r['lo']):02d}-{int(r['hi']):02d}" for r in rows] == ["01-10", "11-20", "21-30"]
    for row in rows:
        name = f"{int(row['lo']):02d}-{int(row['hi']):02d}"
        members = [i for i, p in enumerate(pieces) if int(row["lo"]) <= len(p) <= int(row["hi"])]
        assert int(row["sequences"]) == len(members)
        if members:
            expected = sacrebleu.corpus_bleu([hypotheses[i] for i in members], [[references[i] for i in members]])
            assert float(row["sacrebleu"]) == pytest.approx(metrics[f"eval/sacrebleu_len/{name}"])
            assert metrics[f"eval/sacrebleu_len/{name}"] == pytest.approx(expected.score)
            assert float(row["chrf"]) == pytest.approx(metrics[f"eval/chrf_len/{name}"])
            expected_ter = sacrebleu.corpus_ter([hypotheses[i] for i in members], [[references[i] for i in members]])
            assert float(row["ter"]) == pytest.approx(metrics[f"eval/ter_len/{name}"]) == expected_ter.score
        else:
            assert row["sacrebleu"] == "" and f"eval/sacrebleu_len/{name}" not in metrics


def test_the_comparisons_self_attention_puts_each_self_attending_run_in_a_column_and_names_the_others():
    """``self_attention_side_by_side``: one figure per stack that some run self-attends with, a column per
    such run, a row per layer holding the head mean of ``Seq2Seq.self_attention`` (computed here on a
    padded batch), a run with fewer layers leaving its lower cell empty; the runs without that stack's
    self-attention get no column and are named in the title. No self-attending run: no figure."""
    from model_checks import stand_in_run

    from attnseq.data.vocab import BOS_TOKEN, PAD
    from attnseq.evaluation.evaluator import decoded_row
    from attnseq.evaluation.pipeline import self_attention_side_by_side
    from attnseq.model import decoder_inputs, greedy_decode

    runs = [stand_in_run("enc-dec"), stand_in_run("gru-dec", encoder="gru", decoder_layers=1, seed=1),
            stand_in_run("rnn", encoder="gru", decoder="bahdanau", seed=2)]
    example = Example(["s3", "s1", "s4", "s0"], ["s3", "s1", "s4", "s0"])
    ids = runs[0].src_vocab.encode(example.src)
    side, expected = [], {}
    with torch.no_grad():
        for trained in runs:
            decoded = decoded_row(greedy_decode(trained.model, torch.tensor([ids]), torch.tensor([4]), max_length=7,
                                                keep_attention=True), 0)
            side.append((trained.name, trained, decoded))
            n = int(decoded.lengths)
            tgt_in = torch.cat([decoder_inputs(decoded.tokens[None]), torch.full((1, n), PAD)])  # (2, T_out)
            maps = trained.model.self_attention(torch.tensor([ids, [ids[0], PAD, PAD, PAD]]), torch.tensor([4, 1]),
                                                tgt_in)
            out = trained.tgt_vocab.decode(decoded.tokens.tolist())
            expected[trained.name] = {
                "encoder": [(m[0, :, :4, :4].mean(0), example.src, example.src) for m in maps.encoder],
                "decoder": [(m[0, :, :n, :n].mean(0), [BOS_TOKEN, *out[:-1]], out) for m in maps.decoder]}
    figures = self_attention_side_by_side(example, side, "the sample")
    assert set(figures) == {"encoder", "decoder"}
    columns = {"encoder": ["enc-dec"], "decoder": ["enc-dec", "gru-dec"]}
    for stack, figure in figures.items():
        drawn = [ax for ax in figure.axes if ax.images]
        reading_order = [(name, layer) for layer in (1, 2) for name in columns[stack]
                         if layer <= len(expected[name][stack])]  # enc-dec: 2 decoder layers, gru-dec: 1
        assert [ax.get_title() for ax in drawn] == [f"{name}: layer {layer}" for name, layer in reading_order]
        for ax, (name, layer) in zip(drawn, reading_order):
            matrix, keys, queries = expected[name][stack][layer - 1]
            torch.testing.assert_close(torch.tensor(ax.images[0].get_array()), matrix)
            assert [t.get_text() for t in ax.get_xticklabels()] == keys
            assert [t.get_text() for t in ax.get_yticklabels()] == queries
        title = figure.texts[0].get_text().replace("\n", " ")
        left_out = {name for name in expected if name not in columns[stack]}
        assert all(name in title.split("not drawn:")[-1] for name in left_out) and "the sample" in title
    assert sum(not ax.axison for ax in figures["decoder"].axes) == 1  # gru-dec's second layer: an empty cell
    assert self_attention_side_by_side(example, side[2:], "the sample") == {}
