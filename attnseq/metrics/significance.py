"""Is one group of runs better than another? Two tests per pair of groups and metric, torch-free.

**Paired bootstrap over the same test sequences.** Runs evaluated with the same evaluation seed
on the same data (``eval.seed``, the run's own seed) decode the same test sequences; their
per-sequence outcomes (``SequenceOutcomes``) are paired sequence by sequence. A group's runs are
paired with the other group's runs that decoded the same sequences (in practice: the same seed),
and the pairs' sequences are pooled. The bootstrap draws ``samples`` resamples of the pooled
sequences, with replacement, the same indices for both groups, and recomputes each metric on each:

- text scores (sacreBLEU, chrF, TER) with sacreBLEU's own paired bootstrap
  (``sacrebleu.significance.PairedTest``, ``test_type="bs"``: Koehn's test as Moses' script does it),
  with sacreBLEU's seed (``SACREBLEU_SEED``, default 12345), only where both groups are compared as
  text (``GroupRuns.text``: the task registry's say, read by the caller); elsewhere no text score is
  tested at all;
- exact match (per sequence, 0/1) and token accuracy (per sequence: correct and real target tokens,
  pooled as a ratio of sums, the way ``eval/acc`` pools them) with the same resampling, seeded by
  ``seed``: the index draws are sacreBLEU's when the two seeds agree.

The p-value is sacreBLEU's: with ``d*`` the resampled differences and ``d`` the observed one,
``p = (1 + #{|d*| − mean|d*| > |d|}) / (samples + 1)``. Where both groups' outcomes are equal on
every pooled sequence there is nothing to test and p is 1 (sacreBLEU's strict count would give
``1 / (samples + 1)``). The 95% interval of the difference is the 2.5th and 97.5th percentiles of
``d*``. sacreBLEU does not return its resampled differences, so for BLEU and TER they are redrawn
here from each sequence's own statistics, which sacreBLEU's public ``sentence_score`` gives (BLEU's
n-gram matches, n-gram totals and lengths; TER's edits and reference length) and which sum to the
corpus score's, over the same resampled indices (``seed``: sacreBLEU's own resamples when the seeds
agree). chrF keeps its statistics private: no interval.

**Welch's t over the seeds.** Where both groups have at least two runs, the runs' own overall
values (``eval/<metric>``) are compared with Welch's unequal-variance t-test
(``scipy.stats.ttest_ind(equal_var=False)``): it asks whether another set of seeds would rank the
groups the same, which the bootstrap over test sequences does not.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

COUNTED = ("acc", "exact_match")
"""The metrics resampled from per-sequence counts."""
TEXT = ("sacrebleu", "chrf", "ter")
"""The text scores sacreBLEU's paired bootstrap resamples, in its order."""
SACREBLEU_SEED_ENV, SACREBLEU_DEFAULT_SEED = "SACREBLEU_SEED", "12345"
ALPHA = 0.05
"""The level at which the figure marks a difference and the docs call one."""


@dataclass(frozen=True)
class SequenceOutcomes:
    """One run's outcome on each test sequence, in its evaluation order."""

    keys: tuple[tuple, ...]
    """What identifies each sequence: its source and target tokens."""
    correct: np.ndarray
    """(N,) correct real target positions (EOS included) per sequence."""
    tokens: np.ndarray
    """(N,) real target positions per sequence."""
    hypotheses: tuple[str, ...] | None = None
    """Text tasks: each sequence's detokenised output."""
    references: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def exact(self) -> np.ndarray:
        return (self.correct == self.tokens).astype(np.int64)  # (N,)

    @staticmethod
    def pooled(parts: Sequence[SequenceOutcomes]) -> SequenceOutcomes:
        text = all(part.hypotheses is not None for part in parts)
        return SequenceOutcomes(
            tuple(key for part in parts for key in part.keys),
            np.concatenate([part.correct for part in parts]),
            np.concatenate([part.tokens for part in parts]),
            tuple(h for part in parts for h in part.hypotheses) if text else None,
            tuple(r for part in parts for r in part.references) if text else None,
        )


@dataclass(frozen=True)
class GroupRuns:
    """A group's runs, as the tests read them: each run's overall values and sequence outcomes."""

    name: str
    scores: list[dict[str, float]]
    """Per run: ``{"acc": …, "exact_match": …, "sacrebleu": …}`` (the run's ``eval/`` values)."""
    outcomes: list[SequenceOutcomes | None]
    text: bool
    """Whether the group's task is compared as text (``attnseq.evaluation.significance.compared_as_text``):
    only then are its text scores tested, whatever its outcomes carry."""


@dataclass(frozen=True)
class Bootstrap:
    a: float
    b: float
    """Each group's value on the pooled paired sequences."""
    difference: float
    """b − a."""
    low: float | None
    high: float | None
    p: float


def resample_indices(n: int, samples: int, seed: int | None) -> np.ndarray:
    """(samples, n) indices drawn with replacement, as sacreBLEU draws them."""
    return np.random.default_rng(seed).choice(n, size=(samples, n), replace=True)


def bootstrap_p(differences: np.ndarray, observed: float) -> float:
    """sacreBLEU's paired-bootstrap p-value of ``observed`` given the resampled ``differences``; 1
    where nothing differs (observed and every resample 0)."""
    magnitude = np.abs(differences)
    if observed == 0 and not magnitude.any():
        return 1.0
    count = int(np.sum(magnitude - magnitude.mean() > abs(observed)))
    return (count + 1) / (len(differences) + 1)


def counted_bootstrap(numer_a: np.ndarray, numer_b: np.ndarray, denom: np.ndarray, samples: int,
                      seed: int | None) -> Bootstrap:
    """The paired bootstrap of ``sum(numer) / sum(denom)`` (token accuracy; exact match with
    ``denom`` all ones), the same resampled sequences for both groups."""
    idx = resample_indices(len(denom), samples, seed)  # (S, N)
    total = denom[idx].sum(1)  # (S,)
    differences = numer_b[idx].sum(1) / total - numer_a[idx].sum(1) / total  # (S,)
    a, b = float(numer_a.sum() / denom.sum()), float(numer_b.sum() / denom.sum())
    low, high = np.percentile(differences, [2.5, 97.5])
    return Bootstrap(a, b, b - a, float(low), float(high), bootstrap_p(differences, b - a))


def text_bootstrap(a: SequenceOutcomes, b: SequenceOutcomes, samples: int, seed: int | None) -> dict[str, Bootstrap]:
    """sacreBLEU's paired bootstrap of BLEU, chrF and TER, ``a`` the baseline, with the interval of the
    difference for BLEU and TER (``text_intervals``; none for chrF)."""
    from sacrebleu.metrics import BLEU, CHRF, TER
    from sacrebleu.significance import PairedTest

    test = PairedTest([("a", list(a.hypotheses)), ("b", list(b.hypotheses))],
                      {"sacrebleu": BLEU(), "chrf": CHRF(), "ter": TER()}, [list(a.references)],
                      test_type="bs", n_samples=samples)
    _, scores = test()
    results = [scores[metric] for metric in scores if metric != "System"]  # in the order of the metrics given
    same = a.hypotheses == b.hypotheses  # nothing to test: p 1 (see the module's docstring)
    intervals = text_intervals(a, b, samples, seed)
    return {name: Bootstrap(result_a.score, result_b.score, result_b.score - result_a.score,
                            *intervals.get(name, (None, None)), 1.0 if same else float(result_b.p_value))
            for name, (result_a, result_b) in zip(TEXT, results, strict=True)}


def text_differences(a: SequenceOutcomes, b: SequenceOutcomes, samples: int, seed: int | None) -> dict[str, np.ndarray]:
    """``(samples,)`` resampled differences b − a of BLEU and TER, each resample's corpus score recomputed
    from the sequences' summed statistics (the module's docstring)."""
    from sacrebleu.metrics import BLEU

    from attnseq.metrics.translation import pooled_ter, ter_edits

    corpus, sentence = BLEU(), BLEU(effective_order=True)  # effective order changes no statistic

    def bleu_stats(o: SequenceOutcomes) -> np.ndarray:
        scores = [sentence.sentence_score(h, [r]) for h, r in zip(o.hypotheses, o.references, strict=True)]
        return np.array([[s.sys_len, s.ref_len, *s.counts, *s.totals] for s in scores], dtype=np.int64)  # (N, 10)

    def ter_stats(o: SequenceOutcomes) -> np.ndarray:
        return np.array(ter_edits(o.hypotheses, o.references), dtype=np.float64)  # (N, 2)

    def bleu(sums: np.ndarray) -> float:
        order = corpus.max_ngram_order
        return corpus.compute_bleu(list(sums[2:2 + order]), list(sums[2 + order:]), int(sums[0]), int(sums[1]),
                                   smooth_method=corpus.smooth_method, smooth_value=corpus.smooth_value,
                                   max_ngram_order=order).score

    def ter_score(sums: np.ndarray) -> float:
        return pooled_ter([(sums[0], sums[1])])  # sacreBLEU's corpus TER

    idx = resample_indices(len(a), samples, seed)  # (S, N)
    differences = {}
    for name, stats, score in (("sacrebleu", bleu_stats, bleu), ("ter", ter_stats, ter_score)):
        stats_a, stats_b = stats(a), stats(b)  # (N, K) each
        differences[name] = np.array([score(stats_b[row].sum(0)) - score(stats_a[row].sum(0)) for row in idx])  # (S,)
    return differences


def text_intervals(a: SequenceOutcomes, b: SequenceOutcomes, samples: int,
                   seed: int | None) -> dict[str, tuple[float, float]]:
    """The 95% interval of b − a for BLEU and TER (``text_differences``' 2.5th and 97.5th percentiles)."""
    return {name: tuple(float(q) for q in np.percentile(d, [2.5, 97.5]))
            for name, d in text_differences(a, b, samples, seed).items()}


def welch_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Welch's t-test p-value of the two samples; None with fewer than two values on a side or no
    variance on either."""
    if len(a) < 2 or len(b) < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):
        return None
    from scipy import stats

    p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    return None if math.isnan(p) else p


def paired_runs(a: GroupRuns, b: GroupRuns) -> list[tuple[SequenceOutcomes, SequenceOutcomes]]:
    """Each run of ``a`` with the first unused run of ``b`` that decoded the same sequences."""
    pairs, used = [], set()
    for outcome_a in a.outcomes:
        for j, outcome_b in enumerate(b.outcomes):
            if outcome_a is not None and outcome_b is not None and j not in used and outcome_a.keys == outcome_b.keys:
                pairs.append((outcome_a, outcome_b))
                used.add(j)
                break
    return pairs


def sacrebleu_seed() -> str:
    """The seed sacreBLEU's paired test reads (``none``: not fixed)."""
    return os.environ.get(SACREBLEU_SEED_ENV, SACREBLEU_DEFAULT_SEED).lower()


def pair_rows(a: GroupRuns, b: GroupRuns, samples: int, seed: int) -> list[dict]:
    """One row per metric both groups report: the paired bootstrap's difference (b − a), interval
    and p, the seed means' difference and Welch's p; the text scores only where both groups are
    compared as text (``GroupRuns.text``)."""
    text = a.text and b.text
    pairs = paired_runs(a, b)
    found: dict[str, Bootstrap] = {}
    if pairs:
        pooled_a = SequenceOutcomes.pooled([pa for pa, _ in pairs])
        pooled_b = SequenceOutcomes.pooled([pb for _, pb in pairs])
        ones = np.ones(len(pooled_a), dtype=np.int64)
        found["acc"] = counted_bootstrap(pooled_a.correct, pooled_b.correct, pooled_a.tokens, samples, seed)
        found["exact_match"] = counted_bootstrap(pooled_a.exact, pooled_b.exact, ones, samples, seed)
        if text and pooled_a.hypotheses is not None and pooled_b.hypotheses is not None:
            found |= text_bootstrap(pooled_a, pooled_b, samples, seed)
    rows = []
    for metric in (*COUNTED, *TEXT) if text else COUNTED:
        values_a = [s[metric] for s in a.scores if s.get(metric) is not None]
        values_b = [s[metric] for s in b.scores if s.get(metric) is not None]
        if not values_a or not values_b:
            continue
        boot = found.get(metric)
        rows.append({
            "group_a": a.name, "group_b": b.name, "metric": metric,
            "mean_a": float(np.mean(values_a)), "mean_b": float(np.mean(values_b)),
            "mean_difference": float(np.mean(values_b) - np.mean(values_a)),
            "paired_a": None if boot is None else boot.a, "paired_b": None if boot is None else boot.b,
            "difference": None if boot is None else boot.difference,
            "ci95_low": None if boot is None else boot.low, "ci95_high": None if boot is None else boot.high,
            "p_bootstrap": None if boot is None else boot.p, "p_welch": welch_p(values_a, values_b),
            "paired_runs": len(pairs), "sequences": sum(len(pa) for pa, _ in pairs),
            "resamples": samples if boot is not None else None,
            "bootstrap_seed": (sacrebleu_seed() if metric in TEXT else str(seed)) if boot is not None else None,
            "runs_a": len(values_a), "runs_b": len(values_b),
        })
    return rows


def significance_rows(groups: Sequence[GroupRuns], samples: int, seed: int) -> list[dict]:
    """``pair_rows`` of every pair of groups, in the groups' order (a before b)."""
    return [row for i, a in enumerate(groups) for b in groups[i + 1:] for row in pair_rows(a, b, samples, seed)]


def p_matrix(rows: Sequence[dict], names: Sequence[str], metric: str, column: str) -> np.ndarray:
    """(G, G) p-values of ``metric`` from ``column`` (``p_bootstrap``, ``p_welch``), symmetric, NaN where
    none (the diagonal; a pair with no shared sequences, or too few seeds)."""
    index = {name: i for i, name in enumerate(names)}
    matrix = np.full((len(names), len(names)), np.nan)
    for row in rows:
        if row["metric"] == metric and row[column] is not None:
            i, j = index[row["group_a"]], index[row["group_b"]]
            matrix[i, j] = matrix[j, i] = row[column]
    return matrix
