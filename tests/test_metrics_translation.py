"""sacreBLEU, chrF and TER (``attnseq.metrics.translation``): equal to sacrebleu's own corpus functions,
overall and on each bucket's own sentences, with the signatures sacrebleu reports; TER is better lower."""

from __future__ import annotations

import pytest
import sacrebleu

from attnseq.errors import ConfigError
from attnseq.metrics import LengthBuckets
from attnseq.metrics.translation import SCORES, corpus_scores, signature_params, signatures, translation_scores

HYPOTHESES = [
    "le chat est sur le tapis", "ouvrir le fichier", "je ne sais pas", "la fenêtre est fermée",
    "enregistrer les modifications avant de quitter", "copier le lien", "le fichier « notes » est vide",
]
REFERENCES = [
    "le chat est sur le tapis", "ouvrir un fichier", "je ne le sais pas", "la fenêtre a été fermée",
    "enregistrer les modifications avant de fermer", "copier l’adresse du lien", "le fichier « notes » est vide",
]
SOURCE_LENGTHS = [6, 3, 4, 4, 7, 3, 12]  # buckets of width 5 up to 12: 01-05, 06-10, 11-12


def sacrebleu_own(hypotheses, references):
    return {"sacrebleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
            "ter": sacrebleu.corpus_ter(hypotheses, [references]).score}


def test_corpus_scores_are_sacrebleus_own():
    assert corpus_scores(HYPOTHESES, REFERENCES) == pytest.approx(sacrebleu_own(HYPOTHESES, REFERENCES), abs=1e-9)


def test_a_perfect_corpus_scores_100_and_a_disjoint_one_nearly_0():
    assert corpus_scores(REFERENCES, REFERENCES) == pytest.approx({"sacrebleu": 100.0, "chrf": 100.0, "ter": 0.0})
    disjoint = corpus_scores(["xyz qwv"] * 2, ["abc def ghi jkl", "mno pqr stu"])
    assert disjoint["sacrebleu"] < 1.0 and disjoint["chrf"] < 1.0
    assert disjoint["ter"] == pytest.approx(100.0)  # 2 substitutions + 2 insertions, 2 + 1: 7 edits of 7 words


@pytest.mark.parametrize("hypothesis, reference, edits, words", [
    ("sat the cat", "the cat sat", 1, 3),  # one shift of a block
    ("the cat sat", "the cat sat down", 1, 4),  # one insertion
    ("The Cat", "the cat", 0, 2),  # case-insensitive by default
])
def test_ter_counts_the_edits_per_reference_word(hypothesis, reference, edits, words):
    assert corpus_scores([hypothesis], [reference])["ter"] == pytest.approx(100 * edits / words)


def test_empty_sentences_score_as_sacrebleu_scores_them():
    hypotheses, references = ["", "the cat", ""], ["the cat sat", "", ""]
    for picked in ([0], [1], [2], [1, 2], [0, 1, 2]):
        chosen = [hypotheses[i] for i in picked], [references[i] for i in picked]
        assert corpus_scores(*chosen) == pytest.approx(sacrebleu_own(*chosen), abs=1e-9), picked


def test_a_corpus_ter_pools_the_edits_of_every_sentence():
    hypotheses, references = ["sat the cat", "the cat sat", "The Cat"], ["the cat sat", "the cat sat down", "the cat"]
    assert corpus_scores(hypotheses, references)["ter"] == pytest.approx(100 * 2 / 9)  # not the mean of 33, 25, 0


def test_each_bucket_is_scored_as_its_own_corpus():
    scores = translation_scores(HYPOTHESES, REFERENCES, SOURCE_LENGTHS, LengthBuckets(12, 5))
    assert scores.overall == pytest.approx(sacrebleu_own(HYPOTHESES, REFERENCES), abs=1e-9)
    assert [(row["bucket"], row["lo"], row["hi"], row["sentences"]) for row in scores.buckets] == [
        ("01-05", 1, 5, 4), ("06-10", 6, 10, 2), ("11-12", 11, 12, 1)]
    for row in scores.buckets:
        members = [i for i, n in enumerate(SOURCE_LENGTHS) if row["lo"] <= n <= row["hi"]]
        expected = sacrebleu_own([HYPOTHESES[i] for i in members], [REFERENCES[i] for i in members])
        assert {name: row[name] for name in SCORES} == pytest.approx(expected, abs=1e-9)


def test_an_empty_bucket_has_no_scores():
    scores = translation_scores(HYPOTHESES[:2], REFERENCES[:2], [2, 3], LengthBuckets(12, 5))
    assert [row["sentences"] for row in scores.buckets] == [2, 0, 0]
    assert scores.buckets[1]["sacrebleu"] is None and scores.buckets[2]["chrf"] is None


def test_a_length_outside_the_buckets_is_an_error_not_clamped():
    with pytest.raises(ConfigError, match="outside"):
        translation_scores(HYPOTHESES[:2], REFERENCES[:2], [2, 13], LengthBuckets(12, 5))


@pytest.mark.parametrize("hypotheses, references, lengths, message", [
    (["a"], ["a", "b"], [1], "1 hypotheses but 2 references"),
    ([], [], [], "no sentences"),
    (["a", "b"], ["a", "b"], [1], "1 source lengths for 2 hypotheses"),
])
def test_mismatched_inputs_are_refused(hypotheses, references, lengths, message):
    with pytest.raises(ValueError, match=message):
        translation_scores(hypotheses, references, lengths, LengthBuckets(5, 5))


def test_the_signatures_are_sacrebleus_own():
    version = sacrebleu.__version__
    assert signatures() == {
        "sacrebleu": f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{version}",
        "chrf": f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{version}",
        "ter": f"nrefs:1|case:lc|tok:tercom|norm:no|punct:yes|asian:no|version:{version}",
    }
    bleu = sacrebleu.metrics.BLEU()
    bleu.corpus_score(HYPOTHESES, [REFERENCES])
    assert signature_params()["sacrebleu.signature"] == str(bleu.get_signature())
    ter = sacrebleu.metrics.TER()
    ter.corpus_score(HYPOTHESES, [REFERENCES])
    assert signature_params()["ter.signature"] == str(ter.get_signature())
    assert set(signature_params()) == {"sacrebleu.signature", "chrf.signature", "ter.signature"}
