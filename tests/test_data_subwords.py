"""Subword vocabularies (``dataset.tokenizer=bpe|unigram``): exact round trips, training on the
training split only, determinism across processes, the JSON artifact, and the vocabulary-size check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tokenizers import Tokenizer, decoders

from attnseq.data.datamodule import Seq2SeqDataModule
from attnseq.data.splits import split_examples
from attnseq.data.tasks import tokenizer_for
from attnseq.data.tokenizers import (
    SPACE_TOKEN,
    SUBWORD_TOKENIZERS,
    SubwordTokenizer,
    detokenize,
    output_text,
)
from attnseq.data.tsv import read_pairs
from attnseq.data.vocab import EOS, PAD, Vocabulary
from attnseq.errors import ConfigError

ENGLISH = [
    "Open the file", "Close the file", "Save the file as", "Delete the selected files", "The file is read-only",
    "Don't save the changes", "Print the page", "Copy the link", "Move the window", "Quit the program",
    "Waiting for @1 seconds", "Search the web", "Rename the folder", "New folder", "Show hidden files",
]
FRENCH = [
    "Ouvrir le fichier", "Fermer le fichier", "Enregistrer le fichier sous", "Supprimer les fichiers choisis",
    "Impossible d'ouvrir le fichier", "Ne pas enregistrer les modifications", "Imprimer la page",
    "Copier l’adresse du lien", "Déplacer la fenêtre", "Quitter le programme", "Attente de @1 secondes",
    "Chercher sur le « Web »", "Renommer le dossier", "Nouveau dossier", "Afficher les fichiers cachés",
]
"""Small translation-like sentences with accents, apostrophes, « », and a placeholder."""


def write_pairs(path, sources, targets):
    path.write_text("".join(f"{s}\t{t}\n" for s, t in zip(sources, targets, strict=True)), encoding="utf-8")
    return path


def metaspace(pieces: list[str]) -> str:
    """Hugging Face's own Metaspace decoder: an independent detokeniser to check ours against."""
    return decoders.Metaspace(replacement=SPACE_TOKEN, prepend_scheme="always").decode(pieces)


@pytest.mark.parametrize("kind", SUBWORD_TOKENIZERS)
def test_decoding_restores_the_text_exactly(kind):
    tokenizer = SubwordTokenizer.train(kind, FRENCH * 3, vocab_size=120, lowercase=False)
    unseen = ["Fermer la page « Web »", "Fichier d'attente de @1 secondes",
              "Déplacer l’adresse du dossier caché"]  # new sentences, seen characters
    for text in FRENCH + unseen:
        pieces = tokenizer.tokenize(text)
        assert len(pieces) >= 1 and pieces[0].startswith(SPACE_TOKEN)
        assert tokenizer.detokenize(pieces) == text
        assert detokenize(pieces, kind) == metaspace(pieces) == text


@pytest.mark.parametrize("kind", SUBWORD_TOKENIZERS)
def test_a_character_never_seen_stays_itself_and_the_vocabulary_reads_it_as_unknown(kind):
    tokenizer = SubwordTokenizer.train(kind, FRENCH, vocab_size=100, lowercase=False)
    text = "Zoé quitte l'Ωmega"  # Z, Ω: not in the training text
    pieces = tokenizer.tokenize(text)
    assert tokenizer.detokenize(pieces) == text
    assert "<unk>" not in pieces
    vocab = Vocabulary.build(tokenizer.tokenize_all(FRENCH))
    unknown = [piece for piece, i in zip(pieces, vocab.encode(pieces)) if i == vocab.encode(["<unk>"])[0]]
    assert {"Z", "Ω"} <= set(unknown)


@pytest.mark.parametrize("kind", SUBWORD_TOKENIZERS)
def test_whitespace_is_normalised_and_lowercasing_is_the_models_own(kind):
    tokenizer = SubwordTokenizer.train(kind, FRENCH, vocab_size=100, lowercase=True)
    pieces = tokenizer.tokenize("  Ouvrir\tLE   fichier ")
    assert tokenizer.detokenize(pieces) == "ouvrir le fichier"
    reloaded = SubwordTokenizer.from_json(tokenizer.to_json())  # the JSON carries the normaliser
    assert reloaded.tokenize("  Ouvrir\tLE   fichier ") == pieces


def test_the_json_artifact_is_the_librarys_own_and_reloads_to_the_same_ids():
    tokenizer = SubwordTokenizer.train("bpe", FRENCH, vocab_size=90)
    saved = tokenizer.to_json()
    library = Tokenizer.from_str(saved)  # loadable without attnseq
    reloaded = SubwordTokenizer.from_json(saved)
    assert reloaded.kind == "bpe" and reloaded.to_json() == saved
    vocab = Vocabulary.build(tokenizer.tokenize_all(FRENCH))
    for text in FRENCH:
        assert library.encode(text.lower()).tokens == tokenizer.tokenize(text)
        assert vocab.encode(reloaded.tokenize(text)) == vocab.encode(tokenizer.tokenize(text))
    with pytest.raises(ValueError, match="not a saved Hugging Face tokenizer"):
        SubwordTokenizer.from_json('{"format": "attnseq.vocabulary"}')


def test_a_vocabulary_too_small_for_the_characters_is_a_config_error_with_the_size_needed():
    texts = ["abc", "cab"]  # characters a, b, c and the space mark: 4, plus the unknown piece
    with pytest.raises(ConfigError, match="dataset.vocab_size=4 cannot hold the 4 distinct characters") as caught:
        SubwordTokenizer.train("unigram", texts, vocab_size=4)
    assert "at least 5" in caught.value.fix
    for kind in SUBWORD_TOKENIZERS:  # the size it names is enough
        assert SubwordTokenizer.train(kind, texts, vocab_size=5).detokenize(["▁abc"]) == "abc"


DETERMINISM_SCRIPT = """
import json, sys
from attnseq.data.tokenizers import SubwordTokenizer
texts = json.loads(sys.argv[2])
tokenizer = SubwordTokenizer.train(sys.argv[1], texts, vocab_size=150)
print(json.dumps({"json": tokenizer.to_json(), "pieces": sorted(tokenizer.model.get_vocab()),
                  "segments": tokenizer.tokenize_all(texts)}))
"""


@pytest.mark.parametrize("kind", SUBWORD_TOKENIZERS)
def test_the_same_corpus_gives_the_same_vocabulary_in_another_process(kind):
    """Hash order changes between processes: train here and in a second one, and compare."""
    texts = ENGLISH * 2 + FRENCH
    here = SubwordTokenizer.train(kind, texts, vocab_size=150)
    there = json.loads(subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT, kind, json.dumps(texts)],
                                      capture_output=True, text=True, check=True, timeout=120).stdout)
    assert sorted(here.model.get_vocab()) == there["pieces"]
    assert here.tokenize_all(texts) == there["segments"]
    assert SubwordTokenizer.train(kind, texts, vocab_size=150).tokenize_all(texts) == there["segments"]
    if kind == "bpe":
        assert here.to_json() == there["json"]


def folder_corpus(tmp_path, train, val, test):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name, (sources, targets) in (("train", train), ("val", val), ("test", test)):
        write_pairs(folder / f"{name}.tsv", sources, targets)
    return folder


def data_module(path, **overrides) -> Seq2SeqDataModule:
    settings = dict(task="tsv", path=str(path), train_lengths=[1, 40], eval_lengths=[1, 40], bucket_width=5,
                    train_size=1000, val_size=1000, test_size=1000, batch_size=8, seed=0, tokenizer="bpe",
                    vocab_size=200, lowercase=False)
    return Seq2SeqDataModule(**{**settings, **overrides})


def test_subwords_are_learned_from_the_training_split_only(tmp_path):
    """A word only validation holds is cut into pieces; the same word in training would be whole."""
    word = "kaleidoscope"  # its letters all occur in training
    val = ([f"Open the {word}"] * 5, [f"Ouvrir le {word}"] * 5)
    data = data_module(folder_corpus(tmp_path, (ENGLISH * 4, FRENCH * 4), val, (ENGLISH[:2], FRENCH[:2])))
    data.setup()
    whole = SPACE_TOKEN + word
    assert set(word) <= set("".join(ENGLISH))
    assert whole not in data.src_tokenizer.model.get_vocab()
    assert len(data.src_tokenizer.tokenize(word)) > 1
    assert data.val_examples[0].src[-1] != whole
    (tmp_path / "control").mkdir()
    control = data_module(folder_corpus(tmp_path / "control", (ENGLISH * 4 + val[0], FRENCH * 4 + val[1]), val,
                                        (ENGLISH[:2], FRENCH[:2])))
    control.setup()
    assert whole in control.src_tokenizer.model.get_vocab()


def test_a_single_file_is_split_before_the_tokenizers_learn(tmp_path):
    path = write_pairs(tmp_path / "pairs.tsv", ENGLISH * 2, FRENCH * 2)
    data = data_module(path, train_size=8, val_size=1, test_size=1, vocab_size=150)
    data.setup()
    train, _, _ = split_examples(read_pairs(path), [0.8, 0.1, 0.1], seed=0)
    expected = SubwordTokenizer.train("bpe", [pair.target for pair in train], vocab_size=150, lowercase=False)
    assert data.tgt_tokenizer.to_json() == expected.to_json()
    assert data.train_examples[0].tgt == expected.tokenize(train[0].target)


def test_given_tokenizers_are_used_as_they_are(tmp_path):
    """Evaluation passes the run's tokenizers in: nothing is learned again, and the examples agree."""
    path = folder_corpus(tmp_path, (ENGLISH, FRENCH), (ENGLISH[:3], FRENCH[:3]), (ENGLISH[3:6], FRENCH[3:6]))
    trained = data_module(path, tokenizer="unigram")
    trained.setup()
    saved = [SubwordTokenizer.from_json(t.to_json()) for t in (trained.src_tokenizer, trained.tgt_tokenizer)]
    again = data_module(path, tokenizer="unigram", text_tokenizers=tuple(saved))
    again.setup()
    assert again.src_tokenizer is saved[0] and again.tgt_tokenizer is saved[1]
    assert again.test_examples == trained.test_examples


def test_a_folder_lacking_a_split_names_it_and_the_fix(tmp_path):
    from attnseq.data.errors import DataError

    folder = tmp_path / "corpus"
    folder.mkdir()
    write_pairs(folder / "train.tsv", ENGLISH, FRENCH)
    write_pairs(folder / "test.tsv", ENGLISH, FRENCH)
    with pytest.raises(DataError, match="lacks val.tsv") as caught:
        data_module(folder)
    assert caught.value.path == str(folder / "val.tsv")
    assert "corpus builder" in caught.value.fix


def test_a_runs_tokenizer_is_rebuilt_from_its_config_and_json():
    bpe = SubwordTokenizer.train("bpe", FRENCH, vocab_size=90)
    rebuilt = tokenizer_for({"task": "tsv", "tokenizer": "bpe"}, bpe.to_json())
    assert rebuilt.tokenize("Ouvrir le dossier") == bpe.tokenize("Ouvrir le dossier")
    with pytest.raises(ValueError, match="pass the JSON the run saved"):
        tokenizer_for({"task": "tsv", "tokenizer": "unigram"})
    assert tokenizer_for({"task": "tsv"}).tokenize("Don't") == ["don't"]  # the config's defaults: word, lowercase
    assert tokenizer_for({"task": "reverse"}).tokenize("s1 S2") == ["s1", "S2"]


def test_output_text_stops_at_eos_and_drops_padding():
    vocab = Vocabulary(["▁le", "▁fichier", "s"])
    le, fichier, s = vocab.encode(["▁le", "▁fichier", "s"])
    bpe = tokenizer_for({"task": "tsv", "tokenizer": "bpe"}, SubwordTokenizer.train("bpe", FRENCH, 90).to_json())
    assert output_text([le, fichier, s, EOS, le], vocab, bpe) == "le fichiers"
    assert output_text([le, fichier, PAD, PAD], vocab, bpe) == "le fichier"
    assert output_text([EOS], vocab, bpe) == ""
