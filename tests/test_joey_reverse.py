"""``experiment=joey_reverse``: JoeyNMT's reverse tutorial remade with attnseq's data code. The composed
preset makes data to the tutorial's specification and the model, optimiser and schedule it names (no
training); sacreBLEU scores the reverse task's outputs as JoeyNMT scores its integer strings; one tiny run
through the real CLI (with ``dataset.batch_type=token``) logs validation and test BLEU with their signature."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from cli_helpers import all_runs, explain, tiny  # noqa: E402  (tests/ on sys.path)
from conftest import train_once
from hydra import compose, initialize_config_dir

from attnseq.config import validate_train
from attnseq.config.validate import logged_metrics
from attnseq.data.tokenizers import output_text
from attnseq.metrics.declarations import SCORES
from attnseq.training import build_datamodule

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("joey")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=joey_reverse", f"paths.output_dir={folder / 'out'}",
                                          f"mlflow.tracking_uri=sqlite:///{folder / 'mlflow.db'}"])
    config = validate_train(cfg)
    data = build_datamodule(config)
    data.setup()
    return config, data


def test_the_data_is_joeys_reverse_task(preset):
    """50,000 training pairs of 1-25 symbols from 50; dev and test 1,000 pairs of 1-30; targets reversed."""
    _, data = preset
    splits = {"train": (data.train_examples, 50_000, (1, 25)), "val": (data.val_examples, 1_000, (1, 30)),
              "test": (data.test_examples, 1_000, (1, 30))}
    symbols = {f"s{k}" for k in range(50)}
    for split, (examples, size, (lo, hi)) in splits.items():
        assert len(examples) == size, split
        lengths = Counter(len(x.src) for x in examples)
        assert min(lengths) == lo and max(lengths) == hi and len(lengths) == hi - lo + 1, split  # every length
        assert all(x.tgt == x.src[::-1] for x in examples), split
        assert set().union(*(x.src for x in examples)) == symbols, split
    assert set(data.src_vocab.tokens[-50:]) == symbols and len(data.src_vocab) == len(data.tgt_vocab)
    assert data.train_examples[:5] != data.test_examples[:5]


def test_the_model_and_training_are_joeys(preset):
    config, _ = preset
    assert (config.encoder.name, config.encoder.cell, config.encoder.bidirectional) == ("bilstm", "lstm", True)
    assert (config.decoder.convention, config.decoder.input_feeding, config.scorer.name) == ("luong", True, "general")
    assert (config.model.embedding_dim, config.model.hidden_size, config.model.layers) == (16, 64, 1)
    assert (config.optimizer.target, config.optimizer.lr) == ("torch.optim.AdamW", 0.001)
    assert (config.dataset.batch_size, config.trainer.accumulate_grad_batches, config.trainer.max_epochs) == (12, 2, 5)
    assert config.scheduler is None and config.checkpoint.monitor == "val/sacrebleu"
    assert config.model.init == "xavier"  # JoeyNMT's initializer, embed_initializer 0.1 and zero biases
    text_scores = {name for name in logged_metrics(config) if name.removeprefix("val/") in SCORES}
    assert text_scores == {"val/sacrebleu"}  # the reverse task declares is_text; JoeyNMT validates by BLEU alone


def test_bleu_of_the_symbols_is_joeys_bleu_of_integers(preset):
    """The outputs are scored as the tokens joined by spaces; sacreBLEU's 13a tokenisation keeps s12 and 12
    whole alike, so naming the integers s0 ... s49 changes no score."""
    import sacrebleu

    _, data = preset
    references = [x.tgt for x in data.test_examples[:200]]
    hypotheses = [tokens[:-1] if i % 3 else tokens[1:] + tokens[:1] for i, tokens in enumerate(references)]
    as_text = [output_text(data.tgt_vocab.encode(tokens), data.tgt_vocab, data.tgt_tokenizer) for tokens in hypotheses]
    assert as_text[1] == " ".join(hypotheses[1])
    ours = sacrebleu.corpus_bleu(as_text, [[" ".join(r) for r in references]]).score
    joeys = sacrebleu.corpus_bleu([" ".join(t[1:] for t in h) for h in hypotheses],
                                  [[" ".join(t[1:] for t in r) for r in references]]).score
    assert ours == pytest.approx(joeys) and 0 < ours < 100


@pytest.mark.slow
def test_the_preset_trains_with_token_batches_and_reports_bleu(tmp_path):
    """One tiny launch: the preset's choices (biLSTM, Luong input feeding, AdamW, accumulation, test after
    fit) with token batches (``dataset.batch_type=token``) train into MLflow, with val/ and test/ sacreBLEU
    and its signature."""
    trained = train_once(tmp_path, "experiment=joey_reverse", *tiny(max_epochs=1, heatmaps=False),
                         "dataset.batch_type=token", "dataset.batch_size=40", "threads=1")
    assert trained.proc.returncode == 0, explain(trained.proc)
    (run,) = all_runs(trained.client, "joey_reverse")
    assert run.info.status == "FINISHED"
    assert (run.data.params["dataset.batch_type"], run.data.params["dataset.batch_size"]) == ("token", "40")
    assert run.data.params["trainer.accumulate_grad_batches"] == "2"
    assert run.data.params["sacrebleu.signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    for key in ("val/sacrebleu", "test/sacrebleu", "test/exact_match"):
        assert 0 <= run.data.metrics[key] <= 100, key
