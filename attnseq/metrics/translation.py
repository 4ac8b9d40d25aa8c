"""Reportable translation scores: sacreBLEU's BLEU, chrF and TER, corpus-level, on detokenised text,
overall and per source-length bucket, with the signatures that say how they were computed.

Scores are on sacreBLEU's scale (BLEU and chrF 0-100; TER, the edits per 100 reference words,
0 and up, better lower), with its defaults (BLEU: 13a tokenisation, exponential smoothing; chrF:
character 6-grams, β = 2; TER: tercom tokenisation, case-insensitive, punctuation kept) and one
reference per sentence. A bucket is scored as
its own corpus (its sentences' statistics pooled), not as the mean of sentence scores. The
hypotheses and references are text as a reader sees it (``attnseq.data.tokenizers.detokenize``),
so the scores do not depend on the model's vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attnseq.metrics.declarations import SCORES
from attnseq.metrics.length_buckets import LengthBuckets

if TYPE_CHECKING:  # sacrebleu is slow to import: it is imported when something is scored
    from sacrebleu.metrics.base import Metric


def _metrics() -> dict[str, Metric]:
    from sacrebleu.metrics import BLEU, CHRF, TER

    return {"sacrebleu": BLEU(), "chrf": CHRF(), "ter": TER()}


def ter_edits(hypotheses: Sequence[str], references: Sequence[str]) -> list[tuple[float, float]]:
    """Each sentence's TER edits and reference words (sacreBLEU's ``TERScore.num_edits``, ``ref_length``).
    A corpus's TER is its sentences' edits over their words (``pooled_ter``), so a sentence's are counted
    once for the corpus and for its bucket: TER's shift search is the slow score (seconds per thousand
    sentences that are far from their references)."""
    from sacrebleu.metrics import TER

    metric = TER()
    scores = (metric.sentence_score(hypothesis, [reference]) for hypothesis, reference in zip(hypotheses, references))
    return [(score.num_edits, score.ref_length) for score in scores]


def pooled_ter(edits: Sequence[tuple[float, float]]) -> float:
    """The TER of the sentences whose ``ter_edits`` these are, as sacreBLEU scores them as one corpus."""
    count, words = sum(e for e, _ in edits), sum(w for _, w in edits)
    return 100.0 * (count / words if words > 0 else 1.0 if count > 0 else 0.0)


@dataclass(frozen=True)
class TranslationScores:
    overall: dict[str, float]
    """Each score of the whole corpus."""
    buckets: list[dict]
    """One row per bucket, empty ones included: ``bucket``, ``lo``, ``hi``, ``sentences`` and each
    score (``None`` for an empty bucket)."""


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str],
                  edits: Sequence[tuple[float, float]] | None = None, scores: Sequence[str] = SCORES,
                  ) -> dict[str, float]:
    """Each of ``scores`` of ``hypotheses`` against ``references`` (one per hypothesis), as one corpus; TER
    from their ``edits`` when given (``ter_edits``)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references: give one reference each")
    if not hypotheses:
        raise ValueError("no sentences to score: give at least one hypothesis and its reference")
    metrics, found = _metrics(), {}
    for name in scores:
        if name == "ter":  # pooled from each sentence's edits (``ter_edits``)
            found[name] = pooled_ter(ter_edits(hypotheses, references) if edits is None else edits)
        else:
            found[name] = metrics[name].corpus_score(list(hypotheses), [list(references)]).score
    return found


def translation_scores(
    hypotheses: Sequence[str], references: Sequence[str], src_lengths: Sequence[int], buckets: LengthBuckets
) -> TranslationScores:
    """The scores overall and in each bucket of the sentences' source lengths (in tokens).

    Raises:
        ConfigError: a source length lies outside ``[1, buckets.max_length]``.
    """
    if len(src_lengths) != len(hypotheses):
        raise ValueError(f"{len(src_lengths)} source lengths for {len(hypotheses)} hypotheses: give one each")
    edits = ter_edits(hypotheses, references)  # once: the corpus's and each bucket's TER pool them
    overall = corpus_scores(hypotheses, references, edits)
    bucket_of, _ = buckets.assign(torch.tensor(list(src_lengths), dtype=torch.long))  # (N,) raises when out of range
    members: list[list[int]] = [[] for _ in buckets.bounds]
    for index, bucket in enumerate(bucket_of.tolist()):
        members[bucket].append(index)
    rows = []
    for name, (lo, hi), indices in zip(buckets.names, buckets.bounds, members, strict=True):
        scores = (
            corpus_scores([hypotheses[i] for i in indices], [references[i] for i in indices],
                          [edits[i] for i in indices])
            if indices
            else dict.fromkeys(SCORES)
        )
        rows.append({"bucket": name, "lo": lo, "hi": hi, "sentences": len(indices), **scores})
    return TranslationScores(overall, rows)


def signatures() -> dict[str, str]:
    """Each score's sacreBLEU signature (``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:…``),
    by score name. sacreBLEU states a signature once a metric has scored, so one sentence is scored first."""
    found = {}
    for name, metric in _metrics().items():
        metric.corpus_score(["a"], [["a"]])
        found[name] = str(metric.get_signature())
    return found


def signature_params() -> dict[str, str]:
    """The signatures as a run's params: ``sacrebleu.signature``, ``chrf.signature``, ``ter.signature``."""
    return {f"{name}.signature": signature for name, signature in signatures().items()}
