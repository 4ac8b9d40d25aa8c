"""benchmarks/text_scores.py: the evaluation's text scores against sacreBLEU's corpus scores of the corpus
and each bucket, on a few synthetic sentences: the same scores, both ways timed."""

from __future__ import annotations

import pytest
from benchmark_scripts import imported  # tests/ on sys.path


@pytest.fixture(scope="module")
def text_scores():
    with imported("text_scores") as module:
        yield module


def test_both_ways_give_the_same_scores_and_are_timed(text_scores):
    rows = text_scores.measure(sentences=40, max_length=12, repeats=1, noise=(0.0, 1.0), words=(50,))
    assert [(row["words"], row["noise"]) for row in rows] == [(50, 0.0), (50, 1.0)]
    for row in rows:
        assert row["found"] == pytest.approx(row["expected"], abs=1e-9)
        assert row["reference_s"] > 0 and row["attnseq_s"] > 0
    assert rows[0]["found"]["ter"] == 0.0 and rows[1]["found"]["ter"] > 50  # near and far outputs
    table = text_scores.render(rows, 40, 12)
    assert "| 100% |" in table and table.count("×") == 2
