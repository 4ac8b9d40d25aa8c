"""The comparison's significance tests against computations written out here: the exact-match
bootstrap as a plain loop with the same seed, Welch's t from its formula; identical groups give
p ≫ 0.05, groups a known large difference apart p < 0.01; runs pair only on the same sequences;
the comparison writes the table and the p-value matrix."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from attnseq.evaluation.compare import Compared, SeedGroup
from attnseq.evaluation.evaluator import EvalResult
from attnseq.evaluation.significance import write_significance
from attnseq.metrics.significance import (
    GroupRuns,
    SequenceOutcomes,
    bootstrap_p,
    counted_bootstrap,
    p_matrix,
    significance_rows,
    text_differences,
    welch_p,
)
from attnseq.metrics.translation import corpus_scores

SAMPLES = 400


def outcomes(correct, tokens, seed: int = 0, hypotheses=None, references=None) -> SequenceOutcomes:
    """Sequences named by ``seed`` and position: two runs of one seed decoded the same ones."""
    keys = tuple(((seed, i), (i,)) for i in range(len(correct)))
    return SequenceOutcomes(keys, np.asarray(correct), np.asarray(tokens), hypotheses, references)


def group(name: str, runs: list[SequenceOutcomes], text: bool | None = None) -> GroupRuns:
    """Compared as text where the runs have text (``text``: say otherwise)."""
    scores = [{"acc": o.correct.sum() / o.tokens.sum(), "exact_match": o.exact.mean()}
              | (corpus_scores(o.hypotheses, o.references) if o.hypotheses else {}) for o in runs]
    return GroupRuns(name, scores, runs, all(o.hypotheses for o in runs) if text is None else text)


def by_metric(rows, metric):
    [row] = [r for r in rows if r["metric"] == metric]
    return row


def test_the_exact_match_bootstrap_is_a_plain_loop_with_the_same_seed():
    rng = np.random.default_rng(3)
    exact_a, exact_b = rng.integers(0, 2, 60), rng.integers(0, 2, 60)
    found = counted_bootstrap(exact_a, exact_b, np.ones(60, dtype=int), SAMPLES, seed=7)

    draws = np.random.default_rng(7).choice(60, size=(SAMPLES, 60), replace=True)  # sacreBLEU's draw
    differences = []
    for resample in draws:
        mean_a = sum(exact_a[i] for i in resample) / 60
        mean_b = sum(exact_b[i] for i in resample) / 60
        differences.append(mean_b - mean_a)
    observed = exact_b.mean() - exact_a.mean()
    magnitude = [abs(d) for d in differences]
    centre = sum(magnitude) / SAMPLES
    beyond = sum(1 for m in magnitude if m - centre > abs(observed))
    assert found.difference == pytest.approx(observed)
    assert found.p == pytest.approx((beyond + 1) / (SAMPLES + 1))
    ordered = sorted(differences)
    assert found.low == pytest.approx(np.percentile(ordered, 2.5)) and found.high == pytest.approx(
        np.percentile(ordered, 97.5))
    assert found.low <= observed <= found.high


def test_welch_is_its_formula():
    a, b = [0.81, 0.84, 0.86, 0.80], [0.70, 0.78, 0.74]
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    t = (np.mean(a) - np.mean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))  # Welch–Satterthwaite
    assert welch_p(a, b) == pytest.approx(2 * stats.t.sf(abs(t), df))
    assert welch_p([0.8], b) is None  # one seed: no test
    assert welch_p([0.8, 0.8], [0.8, 0.8]) is None  # no variance anywhere: no test


def test_identical_groups_are_not_called_different():
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(3):
        tokens = rng.integers(3, 9, 200)
        runs.append(outcomes(rng.binomial(tokens, 0.7), tokens, seed))
    rows = significance_rows([group("a", runs), group("b", list(runs))], SAMPLES, seed=12345)
    for metric in ("acc", "exact_match"):
        row = by_metric(rows, metric)
        assert row["p_bootstrap"] > 0.5 and row["difference"] == 0 and row["paired_runs"] == 3
        assert row["p_welch"] is None or row["p_welch"] > 0.5
        assert row["ci95_low"] == row["ci95_high"] == 0


def test_a_known_large_difference_is_called():
    rng = np.random.default_rng(1)
    weak, strong = [], []
    for seed in range(3):
        tokens = rng.integers(3, 9, 300)
        weak.append(outcomes(rng.binomial(tokens, 0.5), tokens, seed))
        strong.append(outcomes(np.where(rng.random(300) < 0.9, tokens, tokens - 1), tokens, seed))
    rows = significance_rows([group("weak", weak), group("strong", strong)], SAMPLES, seed=12345)
    for metric in ("acc", "exact_match"):
        row = by_metric(rows, metric)
        assert row["p_bootstrap"] < 0.01 and row["p_welch"] < 0.01 and row["difference"] > 0.2
        assert 0 < row["ci95_low"] <= row["difference"] <= row["ci95_high"]
        assert row["sequences"] == 900


def test_text_scores_use_sacrebleus_paired_bootstrap():
    references = [f"the cat number {i} sat on the mat near house {i % 7}" for i in range(80)]
    garbled = [" ".join(reversed(r.split())) for r in references]
    tokens = np.full(80, 4)
    right = outcomes(tokens, tokens, hypotheses=tuple(references), references=tuple(references))
    wrong = outcomes(tokens - 1, tokens, hypotheses=tuple(garbled), references=tuple(references))
    rows = significance_rows([group("wrong", [wrong]), group("right", [right])], 200, seed=12345)
    bleu, ter = by_metric(rows, "sacrebleu"), by_metric(rows, "ter")
    assert bleu["p_bootstrap"] < 0.01 and bleu["difference"] > 50 and bleu["paired_b"] == pytest.approx(100)
    assert ter["difference"] < 0 and ter["p_bootstrap"] < 0.01  # TER: better lower
    assert bleu["ci95_low"] <= bleu["difference"] <= bleu["ci95_high"] and bleu["ci95_low"] > 0
    assert ter["ci95_low"] <= ter["difference"] <= ter["ci95_high"] < 0
    assert by_metric(rows, "chrf")["ci95_low"] is None  # chrF's statistics are sacreBLEU's own
    same = significance_rows([group("a", [right]), group("b", [right])], 200, seed=12345)
    assert all(row["p_bootstrap"] == 1.0 for row in same)


def test_the_text_intervals_resample_what_sacrebleus_own_bootstrap_resamples(monkeypatch):
    """BLEU and TER redrawn from each sentence's statistics over the same indices: each resample's score is
    the corpus score of the resampled sentences (sacreBLEU's ``corpus_score``, recomputed here for a few),
    and the p-value of these differences is the one sacreBLEU's paired test reports (same seed)."""
    from sacrebleu.metrics import BLEU, TER

    rng = np.random.default_rng(5)
    words = [f"w{i}" for i in range(30)]
    references = [" ".join(rng.choice(words, rng.integers(4, 12))) for _ in range(60)]

    def noisy(keep: float) -> tuple[str, ...]:
        return tuple(" ".join(w for w in r.split() if rng.random() < keep) or "w0" for r in references)

    tokens = np.full(60, 4)
    a = outcomes(tokens, tokens, hypotheses=noisy(0.80), references=tuple(references))
    b = outcomes(tokens, tokens, hypotheses=noisy(0.83), references=tuple(references))
    differences = text_differences(a, b, 300, seed=12345)
    draws = np.random.default_rng(12345).choice(60, size=(300, 60), replace=True)
    for k in (0, 1, 299):
        picked = draws[k]
        for name, metric in (("sacrebleu", BLEU()), ("ter", TER())):
            score = [metric.corpus_score([h.hypotheses[i] for i in picked], [[references[i] for i in picked]]).score
                     for h in (a, b)]
            assert differences[name][k] == pytest.approx(score[1] - score[0], abs=1e-9), (name, k)
    monkeypatch.delenv("SACREBLEU_SEED", raising=False)  # sacreBLEU's default seed, 12345
    rows = significance_rows([group("a", [a]), group("b", [b])], 300, seed=12345)
    for name in ("sacrebleu", "ter"):
        row = by_metric(rows, name)
        assert bootstrap_p(differences[name], row["difference"]) == pytest.approx(row["p_bootstrap"], abs=2 / 301)
        assert 0.01 < row["p_bootstrap"] < 1  # a small difference: neither end of the scale
        assert row["ci95_low"] < row["difference"] < row["ci95_high"]


def test_runs_pair_only_on_the_same_sequences():
    tokens = np.full(50, 5)
    a = group("a", [outcomes(tokens, tokens, seed=0), outcomes(tokens, tokens, seed=1)])
    b = group("b", [outcomes(tokens - 1, tokens, seed=2), outcomes(tokens - 1, tokens, seed=3)])
    row = by_metric(significance_rows([a, b], SAMPLES, seed=12345), "acc")
    assert row["paired_runs"] == 0 and row["p_bootstrap"] is None and row["difference"] is None
    assert row["mean_difference"] == pytest.approx(-0.2) and row["p_welch"] is None  # no variance: no test
    matrix = p_matrix([row], ["a", "b"], "acc", "p_bootstrap")
    assert np.isnan(matrix).all()


def seed_group(label: str, runs: list[SequenceOutcomes], task: str = "copy") -> SeedGroup:
    members = []
    for seed, run in enumerate(runs):
        trained = SimpleNamespace(run=SimpleNamespace(data=SimpleNamespace(params={"seed": str(seed)})),
                                  config={"dataset": {"task": task}})
        metrics = {"eval/acc": run.correct.sum() / run.tokens.sum(), "eval/exact_match": run.exact.mean()}
        if run.hypotheses is not None:  # scored as text, whether or not the comparison tests it so
            metrics |= {f"eval/{name}": value for name, value in corpus_scores(run.hypotheses, run.references).items()}
        members.append(Compared(trained, EvalResult(metrics, [], outcomes=run)))
    return SeedGroup(label, members)


def test_the_comparison_writes_the_table_and_the_p_value_matrix(tmp_path):
    rng = np.random.default_rng(2)
    tokens = rng.integers(3, 9, 100)
    groups = [seed_group(name, [outcomes(rng.binomial(tokens, p), tokens, seed) for seed in range(2)])
              for name, p in (("scorer=dot", 0.9), ("scorer=none", 0.4), ("scorer=additive", 0.88))]
    paths = write_significance(groups, tmp_path, 200, 12345, "3 groups")
    assert {path.name for path in paths.values()} == {"significance.csv", "significance.md", "significance.png"}
    rows = list(csv.DictReader(open(paths["significance_csv"])))
    assert len(rows) == 3 * 2  # three pairs, two metrics
    assert {(r["group_a"], r["group_b"]) for r in rows} == {("scorer=dot (2 seeds)", "scorer=none (2 seeds)"),
                                                             ("scorer=dot (2 seeds)", "scorer=additive (2 seeds)"),
                                                             ("scorer=none (2 seeds)", "scorer=additive (2 seeds)")}
    for row in rows:
        assert 0 < float(row["p_bootstrap"]) <= 1 and 0 <= float(row["p_welch"]) <= 1
        assert float(row["paired_a"]) == pytest.approx(float(row["mean_a"]))  # seed sizes equal: the same mean
    assert paths["significance_figure"].stat().st_size > 0
    assert paths["significance_markdown"].read_text().count("| scorer=dot (2 seeds) |") == 4
    assert write_significance(groups[:1], tmp_path / "one", 200, 12345, "1 group") == {}


def sentence_runs(rng: np.random.Generator, seeds: int, keep: float) -> list[SequenceOutcomes]:
    """Runs whose outputs drop words of their references with probability 1 − ``keep``: text outcomes; the
    runs of one seed share their references (they decoded the same sequences)."""
    words = [f"w{i}" for i in range(20)]
    runs = []
    for seed in range(seeds):
        drawn = np.random.default_rng(100 + seed)
        references = [" ".join(drawn.choice(words, drawn.integers(3, 9))) for _ in range(40)]
        hypotheses = [" ".join(w for w in r.split() if rng.random() < keep) or "w0" for r in references]
        tokens = np.array([len(r.split()) + 1 for r in references])
        correct = np.array([t if h == r else t // 2 for h, r, t in zip(hypotheses, references, tokens)])
        runs.append(outcomes(correct, tokens, seed, tuple(hypotheses), tuple(references)))
    return runs


@pytest.mark.parametrize("task", ["copy", "reverse", "sort"])
def test_a_symbol_task_has_only_its_exact_match_and_accuracy_tested(task, tmp_path, monkeypatch):
    """Whatever its runs carry (``reverse`` is scored with sacreBLEU, and these outcomes have text): the task
    registry says symbols, so sacreBLEU's bootstrap never runs and no text score gets a row or a panel."""
    from attnseq.data.tasks import TASKS
    from attnseq.metrics import significance

    assert TASKS.lookup(task).is_symbolic and TASKS.lookup("reverse").is_text

    def no_text_bootstrap(*args, **kwargs):
        raise AssertionError("the text bootstrap ran on a symbol task")

    monkeypatch.setattr(significance, "text_bootstrap", no_text_bootstrap)
    monkeypatch.setattr(significance, "text_differences", no_text_bootstrap)
    rng = np.random.default_rng(4)
    groups = [seed_group(name, sentence_runs(rng, 2, keep), task) for name, keep in (("a", 0.6), ("b", 0.95))]
    assert all(member.result.metrics.get("eval/sacrebleu") is not None for g in groups for member in g.members)
    paths = write_significance(groups, tmp_path, 200, 12345, "symbols")
    rows = list(csv.DictReader(open(paths["significance_csv"])))
    assert sorted(row["metric"] for row in rows) == ["acc", "exact_match"]
    assert all(float(row["p_bootstrap"]) < 0.01 for row in rows)  # the gap is there, and tested
    markdown = paths["significance_markdown"].read_text()
    assert "sacreBLEU |" not in markdown and "chrF |" not in markdown and "TER |" not in markdown


def test_a_text_task_has_its_text_scores_tested_with_sacrebleus_bootstrap(tmp_path, monkeypatch):
    from attnseq.metrics import significance

    calls = []
    text_bootstrap = significance.text_bootstrap
    monkeypatch.setattr(significance, "text_bootstrap", lambda *args: calls.append(args) or text_bootstrap(*args))
    rng = np.random.default_rng(4)
    groups = [seed_group(name, sentence_runs(rng, 2, keep), "translate") for name, keep in (("a", 0.6), ("b", 0.95))]
    paths = write_significance(groups, tmp_path, 200, 12345, "text")
    rows = list(csv.DictReader(open(paths["significance_csv"])))
    assert sorted(row["metric"] for row in rows) == ["acc", "chrf", "exact_match", "sacrebleu", "ter"]
    assert len(calls) == 1  # one pair of groups
    for metric in ("sacrebleu", "chrf"):
        [row] = [r for r in rows if r["metric"] == metric]
        assert float(row["difference"]) > 0 and float(row["p_bootstrap"]) < 0.01
        assert row["bootstrap_seed"] == significance.sacrebleu_seed()


def test_text_scores_are_tested_only_where_both_groups_are_compared_as_text():
    rng = np.random.default_rng(6)
    a, b = sentence_runs(rng, 1, 0.6), sentence_runs(rng, 1, 0.95)
    both = significance_rows([group("a", a), group("b", b)], 100, seed=12345)
    assert {row["metric"] for row in both} == {"acc", "exact_match", "sacrebleu", "chrf", "ter"}
    one = significance_rows([group("a", a), group("b", b, text=False)], 100, seed=12345)
    assert {row["metric"] for row in one} == {"acc", "exact_match"}
