"""The text scores of an evaluation (``translation_scores``: sacreBLEU, chrF and TER of the corpus and of
each source-length bucket) against scoring the corpus and each bucket with sacreBLEU's own corpus
functions, as attnseq did before TER's per-sentence edits were counted once for both. Synthetic
sentences (words drawn from 50 or 500) with a share of their words replaced, from outputs near their
references to outputs unrelated to them (an untrained model's, or a long sentence without attention).

    ../.venv/bin/python text_scores.py                  # 2,000 sentences, lengths 2-30, 3 repeats
    ../.venv/bin/python text_scores.py --sentences 500
"""

from __future__ import annotations

import argparse
import itertools
import random
import time

import torch
from sacrebleu.metrics import BLEU, CHRF, TER

from attnseq.metrics import LengthBuckets
from attnseq.metrics.translation import SCORES, translation_scores

NOISE = (0.05, 0.3, 1.0)
"""The share of each output's words replaced by a random one."""
WORDS = (50, 500)
"""Distinct words: TER's shift search costs most where unrelated outputs share many words with their references."""


def corpora(sentences: int, max_length: int, noise: float, words: int = 50,
            seed: int = 0) -> tuple[list[str], list[str], list[int]]:
    """Hypotheses, references and source lengths (a copy-like task: as long as the reference), of ``words``
    distinct words (JoeyNMT's reverse task: 50)."""
    draw = random.Random(seed)
    lengths = [draw.randint(2, max_length) for _ in range(sentences)]
    references = [" ".join(str(draw.randrange(words)) for _ in range(n)) for n in lengths]
    hypotheses = [" ".join(w if draw.random() > noise else str(draw.randrange(words)) for w in r.split())
                  for r in references]
    return hypotheses, references, lengths


def each_corpus_on_its_own(hypotheses: list[str], references: list[str], lengths: list[int],
                           buckets: LengthBuckets) -> dict[str, float]:
    """The reference: sacreBLEU's corpus scores of the whole corpus, then of each bucket's sentences."""
    def scored(picked: list[int]) -> dict[str, float]:
        hyps, refs = [hypotheses[i] for i in picked], [[references[i] for i in picked]]
        metrics = {"sacrebleu": BLEU(), "chrf": CHRF(), "ter": TER()}
        return {name: metric.corpus_score(hyps, refs).score for name, metric in metrics.items()}

    bucket_of = buckets.assign(torch.tensor(lengths))[0].tolist()  # (N,)
    for bucket in range(len(buckets.bounds)):
        picked = [i for i, b in enumerate(bucket_of) if b == bucket]
        if picked:
            scored(picked)
    return scored(list(range(len(hypotheses))))


def measure(sentences: int = 2000, max_length: int = 30, repeats: int = 3, noise: tuple[float, ...] = NOISE,
            words: tuple[int, ...] = WORDS) -> list:
    """Per vocabulary and noise level: the best seconds of each way over ``repeats`` (alternating) and their
    overall scores."""
    buckets = LengthBuckets(max_length, 5)
    rows = []
    for vocabulary, share in itertools.product(words, noise):
        hypotheses, references, lengths = corpora(sentences, max_length, share, vocabulary)
        seconds: dict[str, list[float]] = {"reference": [], "attnseq": []}
        for _ in range(repeats):
            start = time.perf_counter()
            expected = each_corpus_on_its_own(hypotheses, references, lengths, buckets)
            seconds["reference"].append(time.perf_counter() - start)
            start = time.perf_counter()
            found = translation_scores(hypotheses, references, lengths, buckets).overall
            seconds["attnseq"].append(time.perf_counter() - start)
        rows.append({"words": vocabulary, "noise": share, "reference_s": min(seconds["reference"]),
                     "attnseq_s": min(seconds["attnseq"]), "expected": expected, "found": found})
    return rows


def render(rows: list, sentences: int, max_length: int) -> str:
    lines = ["## Text scores of an evaluation", "",
             f"`translation_scores` on {sentences:,} synthetic sentences (lengths 2-{max_length}, buckets of 5) "
             "against sacreBLEU's corpus scores of the corpus and of each bucket (the way before TER's edits were "
             "counted once); best seconds of the repeats, alternating.", "",
             "| distinct words | words replaced | sacreBLEU / chrF / TER | before s | attnseq s | ratio |",
             "|---:|---:|---|---:|---:|---:|"]
    for row in rows:
        scores = " / ".join(f"{row['found'][name]:.1f}" for name in SCORES)
        seconds = f"{row['reference_s']:.2f} | {row['attnseq_s']:.2f} | {row['reference_s'] / row['attnseq_s']:.2f}×"
        lines.append(f"| {row['words']} | {row['noise']:.0%} | {scores} | {seconds} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--max-length", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = measure(args.sentences, args.max_length, args.repeats)
    print(render(rows, args.sentences, args.max_length))


if __name__ == "__main__":
    main()
