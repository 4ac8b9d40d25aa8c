"""The metrics suite validation and evaluation share: the same batches through the LightningModule's
validation and through ``evaluate.py``'s evaluator give the same value for every metric both
report; the suite's metrics against computations written here; the names derived from the
registered metrics; and a metric defined in a module outside the package, registered with
``plugins=[...]``, trained through the real ``train.py`` and found in MLflow."""

from __future__ import annotations

import os
import sys
import textwrap
import uuid
from dataclasses import replace
from pathlib import Path

import lightning as L
import pytest
import torch
from cli_helpers import all_runs, clean_env, explain, outputs_under, run_cli, tiny
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from torch.nn import functional as F
from torch.utils.data import DataLoader

from attnseq.config import validate_train
from attnseq.data import collate
from attnseq.data.vocab import PAD
from attnseq.evaluation.evaluator import EvalSettings, evaluate_run
from attnseq.evaluation.trained_runs import TrainedRun
from attnseq.metrics import METRICS, BatchOutputs, MetricSuite, SuiteMetric, SuiteSpec, lower_is_better, names
from attnseq.metrics.declarations import SCORES
from attnseq.training.build import build_datamodule, build_module

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
BATCH_SIZE = 16


def composed(tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=[
            "dataset.train_size=32", "dataset.val_size=48", "dataset.batch_size=16", "dataset.train_lengths=[1,6]",
            "dataset.eval_lengths=[1,12]", "dataset.bucket_width=5", "model.hidden_size=16",
            "model.embedding_dim=8", f"paths.output_dir={tmp_path / 'out'}",
            f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", *overrides,
        ])


# ---------------------------------------------------------------- validation = evaluation
@pytest.mark.parametrize("overrides", [[], ["dataset=translate", "training.val_text_scores=[sacrebleu,chrf,ter]"],
                                       ["scorer=none"]], ids=["copy", "translate", "no-attention"])
def test_validation_and_evaluation_report_the_same_numbers_on_the_same_batches(tmp_path, overrides):
    cfg = composed(tmp_path, *overrides)
    config = validate_train(cfg)
    data = build_datamodule(config)
    data.setup()
    torch.manual_seed(0)
    module = build_module(config, data)
    # the evaluator's batches: the examples sorted by source length, in chunks of the batch size
    ordered = sorted(data.val_examples, key=lambda example: len(example.src))
    encoded = data.encode_examples(ordered)
    batches = [collate(encoded[i : i + BATCH_SIZE]) for i in range(0, len(encoded), BATCH_SIZE)]
    data.val_dataloader = lambda: DataLoader(batches, batch_size=None, collate_fn=lambda batch: batch)
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=str(tmp_path))
    trainer.validate(module, datamodule=data, verbose=False)
    validated = {name: float(value) for name, value in trainer.callback_metrics.items()}

    run_config = OmegaConf.to_container(cfg, resolve=True)
    trained = TrainedRun(None, run_config, data.src_vocab, data.tgt_vocab, module.model,
                         data.src_tokenizer, data.tgt_tokenizer)
    settings = EvalSettings(lengths=tuple(cfg.dataset.eval_lengths), bucket_width=cfg.dataset.bucket_width,
                            batch_size=BATCH_SIZE, counterfactual=False)
    result = evaluate_run(trained, settings, examples=data.val_examples)

    evaluated = {name.removeprefix("eval/"): value for name, value in result.metrics.items()}
    in_both = {name.removeprefix("val/") for name in validated} & set(evaluated)
    # every validation metric but the loss and the running best is an evaluation metric too
    assert in_both == {name.removeprefix("val/") for name in validated} - {"loss", "acc_best"}
    assert {"acc", "exact_match", "acc_train_lengths", "acc_len/01-05", "acc_len/11-12"} <= in_both
    if module.model.attention is not None:
        assert {"attn_entropy", "attn_margin_train_lengths"} <= in_both
    if "dataset=translate" in overrides:
        assert {"sacrebleu", "chrf", "ter", "align_acc_len/06-10"} <= in_both
    for name in sorted(in_both):  # Lightning holds the logged values as float32, as MLflow receives them
        assert validated[f"val/{name}"] == float(torch.tensor(evaluated[name], dtype=torch.float32)), name
    validated_rows = module.last_bucket_tables["val"]
    assert [{key: row[key] for key in validated_rows[0]} for row in result.bucket_rows] == validated_rows
    assert set(validated) == set(names(module.val_metrics.spec))  # what the names promise is what is logged


# ---------------------------------------------------------------- the metrics, by hand
def spec(stage: str = "val", **changes) -> SuiteSpec:
    fields = dict(max_length=9, bucket_width=3, train_lengths=(2, 5), attention=True, gold_alignment=True, text=False)
    return SuiteSpec(stage, **(fields | changes))


def random_outputs(gen: torch.Generator, batch: int = 6, vocab: int = 7, sources: torch.Tensor | None = None
                   ) -> BatchOutputs:
    """A padded batch with random predictions, teacher-forced logits, peaked attention and alignment."""
    src_lengths = torch.randint(1, 10, (batch,), generator=gen) if sources is None else sources  # (B,)
    tgt_lengths = torch.randint(2, 6, (batch,), generator=gen)  # (B,)
    t_tgt, t_enc = int(tgt_lengths.max()), int(src_lengths.max())
    real = torch.arange(t_tgt)[None, :] < tgt_lengths[:, None]  # (B, T_tgt)
    target = torch.randint(3, vocab, (batch, t_tgt), generator=gen).masked_fill(~real, PAD)  # (B, T_tgt)
    predictions = torch.where(torch.rand(batch, t_tgt + 1, generator=gen) < 0.6,
                              F.pad(target, (0, 1), value=PAD),
                              torch.randint(3, vocab, (batch, t_tgt + 1), generator=gen))  # (B, T_tgt + 1)
    logits = torch.randn(batch, t_tgt, vocab, generator=gen)  # (B, T_tgt, V)
    valid = torch.arange(t_enc)[None, :] < src_lengths[:, None]  # (B, T_enc)
    scores = 4 * torch.randn(batch, 1, t_tgt, t_enc, generator=gen).masked_fill(~valid[:, None, None, :], float("-inf"))
    alignment = torch.minimum(torch.arange(t_tgt)[None, :].expand(batch, -1), src_lengths[:, None] - 1)
    alignment = alignment.masked_fill(~real, -1)  # (B, T_tgt)
    loss = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD)
    return BatchOutputs(target, tgt_lengths, src_lengths, alignment, predictions, attention=scores.softmax(-1),
                        logits=logits, loss=loss)


def test_the_loss_is_the_mean_of_the_batch_means_weighed_by_batch_size():
    gen = torch.Generator().manual_seed(0)
    suite = MetricSuite(spec())
    batches = [random_outputs(gen, batch=size) for size in (6, 2, 5)]
    for outputs in batches:
        suite.update(outputs)
    expected = sum(float(o.loss) * o.target.shape[0] for o in batches) / sum(o.target.shape[0] for o in batches)
    assert float(suite.compute()["val/loss"]) == pytest.approx(expected, rel=1e-6)


def test_the_training_lengths_subset_counts_only_the_rows_inside_them():
    gen = torch.Generator().manual_seed(1)
    suite = MetricSuite(spec())
    correct = tokens = exact = rows = 0
    for _ in range(4):
        outputs = random_outputs(gen)
        suite.update(outputs)
        for b in range(outputs.target.shape[0]):
            if not 2 <= int(outputs.src_lengths[b]) <= 5:
                continue
            n = int(outputs.target_lengths[b])
            hits = sum(int(outputs.predictions[b, t] == outputs.target[b, t]) for t in range(n))
            correct, tokens, exact, rows = correct + hits, tokens + n, exact + (hits == n), rows + 1
    values = suite.compute()
    assert rows > 0
    assert float(values["val/acc_train_lengths"]) == pytest.approx(correct / tokens)
    assert float(values["val/exact_match_train_lengths"]) == pytest.approx(exact / rows)


def test_the_attention_diagnostics_inside_the_training_lengths_are_those_of_the_rows_inside():
    """``align_acc_train_lengths`` by hand: over the inside rows' real, gold-aligned steps, whether
    the attention peaks on the gold position."""
    gen = torch.Generator().manual_seed(2)
    suite = MetricSuite(spec())
    hits = gold = 0
    for _ in range(3):
        outputs = random_outputs(gen)
        suite.update(outputs)
        for b in range(outputs.target.shape[0]):
            if 2 <= int(outputs.src_lengths[b]) <= 5:
                for t in range(int(outputs.target_lengths[b])):
                    if outputs.alignment[b, t] >= 0:
                        gold += 1
                        hits += int(outputs.attention[b, 0, t].argmax() == outputs.alignment[b, t])
    assert float(suite.compute()["val/align_acc_train_lengths"]) == pytest.approx(hits / gold)


def test_the_counterfactual_flip_rate_by_hand():
    gen = torch.Generator().manual_seed(3)
    suite = MetricSuite(spec("eval", counterfactual=True))
    flips = steps = 0
    for _ in range(2):
        outputs = random_outputs(gen)
        replayed = {mode: outputs.logits + torch.randn(outputs.logits.shape, generator=gen) for mode in ("permute",
                                                                                                        "uniform")}
        suite.update(replace(outputs, replayed=replayed))
        for b in range(outputs.target.shape[0]):
            for t in range(int(outputs.target_lengths[b])):
                steps += 1
                flips += int(outputs.logits[b, t].argmax() != replayed["permute"][b, t].argmax())
    values = suite.compute()
    assert values["eval/cf_permute_flip_rate"] == pytest.approx(flips / steps)
    rows = suite.bucket_rows()
    assert [row["bucket"] for row in rows] == ["01-03", "04-06", "07-09"]
    assert all({"acc", "align_acc", "cf_permute_flip_rate", "cf_uniform_tv"} <= set(row) for row in rows)


def test_text_scores_are_sacrebleus_of_the_detokenised_outputs():
    import sacrebleu

    words = {3: "the", 4: "cat", 5: "sat", 6: "down"}
    to_text = lambda ids: " ".join(words[i] for i in ids if i in words)  # noqa: E731
    gen = torch.Generator().manual_seed(4)
    suite = MetricSuite(spec(text=True, to_text=to_text))
    chosen = MetricSuite(spec(text=True, to_text=to_text, text_scores=("chrf",)))  # training.val_text_scores=[chrf]
    hypotheses, references = [], []
    for _ in range(3):
        outputs = random_outputs(gen)
        suite.update(outputs)
        chosen.update(outputs)
        hypotheses += [to_text(row) for row in outputs.predictions.tolist()]
        references += [to_text(row[:n]) for row, n in zip(outputs.target.tolist(), outputs.target_lengths.tolist())]
    values = suite.compute()
    assert float(values["val/sacrebleu"]) == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score,
                                                          rel=1e-6)
    assert float(values["val/chrf"]) == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score, rel=1e-6)
    assert float(values["val/ter"]) == pytest.approx(sacrebleu.corpus_ter(hypotheses, [references]).score, rel=1e-6)
    only = {name: value for name, value in chosen.compute().items() if name[4:] in SCORES}
    assert only == {"val/chrf": pytest.approx(float(values["val/chrf"]))}  # BLEU and TER not computed


# ---------------------------------------------------------------- names, from the registry
@pytest.mark.parametrize("stage", ["val", "test", "eval"])
@pytest.mark.parametrize("capabilities", [
    dict(attention=True, gold_alignment=True, text=False),
    dict(attention=True, gold_alignment=False, text=True),
    dict(attention=False, gold_alignment=True, text=True),
], ids=["gold", "text", "no-attention"])
def test_a_full_epoch_reports_exactly_the_names_the_suite_derives(stage, capabilities):
    """Every bucket filled (source lengths 1..9, all in range): ``compute()`` gives each name once."""
    gen = torch.Generator().manual_seed(5)
    words = lambda ids: " ".join(str(i) for i in ids if i > 2)  # noqa: E731
    counterfactual = stage == "eval" and capabilities["attention"]
    suite = MetricSuite(spec(stage, **capabilities, counterfactual=counterfactual, to_text=words))
    for _ in range(6):
        outputs = random_outputs(gen, batch=9, sources=torch.arange(1, 10))
        alignment = outputs.alignment if capabilities["gold_alignment"] else torch.full_like(outputs.alignment, -1)
        replayed = {"permute": outputs.logits.flip(-1), "uniform": outputs.logits * 0}
        suite.update(replace(outputs, alignment=alignment, replayed=replayed))
    reported = set(suite.compute())
    expected = set(suite.names()) - ({"val/acc_best"} if stage == "val" else set())
    assert reported == expected
    assert {"val/acc_best"} <= set(suite.names()) or stage != "val"


def test_lower_is_better_is_what_each_metric_declares():
    assert lower_is_better("val/loss") and lower_is_better("train/loss") and lower_is_better("train/padding_fraction")
    assert lower_is_better("val/aer") and lower_is_better("val/attn_entropy_train_lengths")
    assert not lower_is_better("val/acc") and not lower_is_better("val/acc_len/01-05")
    assert not lower_is_better("val/align_offset") and not lower_is_better("val/sacrebleu")
    assert lower_is_better("val/ter") and lower_is_better("eval/ter_len/01-05") and not lower_is_better("eval/chrf")
    assert not lower_is_better("train/loss_step")


@pytest.fixture
def registry():
    """The registry as it was before the test: metrics defined by a test leave with it."""
    saved = dict(METRICS)
    yield METRICS
    METRICS.clear()
    METRICS.update(saved)


def test_a_metric_registers_on_subclassing_with_its_capabilities(registry):
    class LongestOutput(SuiteMetric):
        name = "longest_output"
        needs_text = True
        stages = ("eval",)
        lower_is_better = True

    assert METRICS["longest_output"] is LongestOutput
    assert "eval/longest_output" in names(spec("eval", text=True))
    assert "eval/longest_output" not in names(spec("eval", text=False))  # needs text
    assert "val/longest_output" not in names(spec("val", text=True))  # evaluation only
    assert lower_is_better("eval/longest_output")

    class Tweaked(LongestOutput):  # a subclass without a name of its own is no new metric
        pass

    assert METRICS["longest_output"] is LongestOutput
    with pytest.raises(TypeError, match="taken"):

        class Again(SuiteMetric):
            name = "longest_output"


# ---------------------------------------------------------------- a metric defined outside the package
PLUGIN_SOURCE = '''
import torch

from attnseq.metrics import SuiteMetric


class TokenErrorRate(SuiteMetric):
    """The share of real target positions the decoded output gets wrong, counted here on its own."""

    name = "{name}"
    lower_is_better = True

    def __init__(self, spec):
        super().__init__(spec)
        self.wrong, self.positions = 0, 0

    def update(self, outputs):
        for row, gold, n in zip(outputs.predictions.tolist(), outputs.target.tolist(),
                                outputs.target_lengths.tolist()):
            row = row + [-1] * max(0, n - len(row))
            self.wrong += sum(row[t] != gold[t] for t in range(n))
            self.positions += n

    def compute(self):
        return {{self.name: torch.tensor(self.wrong / self.positions)}} if self.positions else {{}}

    def reset(self):
        self.wrong, self.positions = 0, 0
'''


@pytest.fixture
def plugin(tmp_path, registry, monkeypatch):
    """A module defining a new metric, importable from ``tmp_path``: (module name, metric name)."""
    tag = uuid.uuid4().hex[:8]
    module, name = f"my_metrics_{tag}", f"token_error_{tag}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(PLUGIN_SOURCE.format(name=name)))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module, name
    sys.modules.pop(module, None)


@pytest.mark.slow
def test_a_new_metric_is_monitored_and_logged_through_the_cli(plugin, tmp_path):
    """Registered by ``plugins=[module]``, the metric is one checkpoint.monitor may name (better lower:
    checkpoint.mode=min), is logged every epoch, and equals 1 - val/acc."""
    module, name = plugin
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    proc = run_cli(
        tmp_path, f"plugins=[{module}]", f"checkpoint.monitor=val/{name}", "checkpoint.mode=min",
        *tiny(max_epochs=2, heatmaps=False), *outputs_under(tmp_path, seeded=True), env=env,
    )
    assert proc.returncode == 0, explain(proc)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = all_runs(client)
    assert run.info.status == "FINISHED"
    errors = {m.step: m.value for m in client.get_metric_history(run.info.run_id, f"val/{name}")}
    accuracies = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val/acc")}
    assert len(errors) == 2 and set(errors) == set(accuracies)
    for step, error in errors.items():
        assert error == pytest.approx(1 - accuracies[step], abs=1e-6)
