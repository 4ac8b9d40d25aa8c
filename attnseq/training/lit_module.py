"""The LightningModule around ``Seq2Seq``: loss, optimisation, and the validation metrics.

Metrics are updated on tensors (no host syncs in the steps) and logged once per epoch:
``train/loss`` (the objective: smoothed under ``training.label_smoothing``; ``val/loss`` is not) and
``train/padding_fraction`` (means of the epoch's batch values, accumulated in
``MeanMetric``s: a ``self.log`` call costs Python time a small model's step cannot spare; with
``nan_strategy="disable"`` torchmetrics ignores the batch-size weights, so each batch counts once),
``train/loss_step`` only on the steps the logger writes (every ``trainer.log_every_n_steps``),
``train/lr`` (the learning rate the epoch trained with; with a schedule stepped per optimizer step,
``scheduler.interval: step``, the rate of each step the logger writes),
``val/acc_best``, and everything ``attnseq.metrics.MetricSuite`` reports for the run (``val/loss``,
``val/acc``, the length buckets, the training-lengths subset, the attention diagnostics, sacreBLEU
and chrF for text tasks: ``attnseq.metrics.names`` lists them), the suite evaluation uses too.
Text references are the targets as the target vocabulary spells them, so a token outside it reads
``<unk>`` there; evaluation (``eval/sacrebleu``) scores against the examples' own text.
``test/…`` likewise. Each validation also keeps a few sample outputs (``last_samples``) that the
console prints and the run logs as a table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import lightning as L
import torch
from torch import Tensor
from torch.nn import functional as F
from torchmetrics import MaxMetric, MeanMetric, Metric

from attnseq.data import collate, encode_examples
from attnseq.data.batch import Batch
from attnseq.data.tasks import TASKS
from attnseq.data.tokenizers import output_text
from attnseq.data.vocab import PAD
from attnseq.metrics import BatchOutputs, MetricSuite, SuiteSpec
from attnseq.metrics.declarations import SCORES
from attnseq.metrics.faithfulness import TrainFaithSettings
from attnseq.model import Seq2Seq, decode_length_limit, greedy_decode
from attnseq.training.optimizers import FULL_PRECISION, OptimizerFactory

SchedulerFactory = Callable[[torch.optim.Optimizer], object]

# the decode-length rule lives in attnseq.model
__all__ = ["Seq2SeqLitModule", "decode_length_limit", "token_cross_entropy"]


class Seq2SeqLitModule(L.LightningModule):
    def __init__(
        self,
        model: Seq2Seq,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        *,
        train_lengths: tuple[int, int],
        max_eval_length: int,
        bucket_width: int,
        teacher_forcing: float = 1.0,
        label_smoothing: float = 0.0,
        scheduler_interval: str = "epoch",
        decode_ratio: float = 1.5,
        decode_extra: int = 5,
        scheduler_monitor: str = "val/loss",
        faith: TrainFaithSettings | None = None,
        val_text_scores: Sequence[str] = SCORES,
    ) -> None:
        super().__init__()
        self.model = model
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_monitor = scheduler_monitor
        self.scheduler_interval = scheduler_interval
        self.label_smoothing = label_smoothing
        self.train_lengths = tuple(train_lengths)
        self.teacher_forcing = teacher_forcing
        self.decode_ratio = decode_ratio
        self.decode_extra = decode_extra
        self.max_eval_length = max_eval_length
        self.bucket_width = bucket_width
        self.faith = faith if faith is not None and faith.samples > 0 and model.attention is not None else None
        self.val_text_scores = tuple(dict.fromkeys(val_text_scores))  # validation's; the test split's: all
        self.val_metrics = self.metric_suite("val")
        self.test_metrics = self.metric_suite("test")
        # nan_strategy="disable": no NaN test (a host sync) per step; FiniteLossGuard stops a NaN loss
        self.train_loss = MeanMetric(nan_strategy="disable")
        self.train_padding = MeanMetric(nan_strategy="disable")
        self.val_acc_best = MaxMetric()
        for metric in (self.train_loss, self.train_padding, self.val_acc_best):
            metric.persistent(True)  # in the checkpoint: a resumed run keeps its best and its running means
        self.last_bucket_tables: dict[str, list[dict]] = {}
        """The latest epoch's per-bucket rows, by stage: read by the tracking callbacks."""
        self.last_samples: list[dict] = []
        """The latest validation's sample outputs (``samples``): read by the console's report."""

    def metric_suite(self, stage: str, data: object = None) -> MetricSuite:
        """The metrics ``stage`` reports, for this model and the task of ``data`` (a data module;
        none: a task without text or gold alignment), persistent in the checkpoint."""
        task = getattr(data, "task", None)
        text = task is not None and TASKS.lookup(task).is_text
        spec = SuiteSpec(
            stage,
            max_length=self.max_eval_length,
            bucket_width=self.bucket_width,
            train_lengths=self.train_lengths,
            attention=self.model.attention is not None,
            gold_alignment=task is not None and TASKS.lookup(task).has_gold_alignment,
            text=text,
            faith=self.faith.groups() if self.faith is not None and stage == "val" else (),
            text_scores=self.val_text_scores if stage == "val" else SCORES,
            to_text=partial(output_text, vocab=data.tgt_vocab, tokenizer=data.tgt_tokenizer) if text else None,
        )
        suite = MetricSuite(spec)
        for metric in suite.modules():
            if isinstance(metric, Metric):
                metric.persistent(True)
        return suite

    def setup(self, stage: str) -> None:
        """The suites again, now that the data (its task, its target vocabulary) is attached."""
        self.val_metrics = self.metric_suite("val", self.trainer.datamodule)
        self.test_metrics = self.metric_suite("test", self.trainer.datamodule)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A checkpoint whose metric states differ from this version's (written before they were
        saved, or with other metrics) resumes with fresh ones for those; the model's own weights
        stay strictly checked."""
        state = checkpoint.get("state_dict")
        if state is None:
            return
        own = self.state_dict()
        for key in [k for k in state if not k.startswith("model.") and k not in own]:
            del state[key]
        for key, value in own.items():
            if not key.startswith("model.") and key not in state:
                state[key] = value

    # -- training ------------------------------------------------------------------------
    def loss(self, logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> Tensor:
        return token_cross_entropy(logits, target, label_smoothing)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        logits, _ = self.model(batch.src, batch.src_lengths, batch.tgt_in, teacher_forcing=self.teacher_forcing)
        loss = self.loss(logits, batch.tgt_out, self.label_smoothing)  # train/loss: the smoothed objective
        size = len(batch)
        padding = 1.0 - (batch.src_lengths.sum() + batch.tgt_lengths.sum()) / (
            batch.src.numel() + batch.tgt_out.numel()
        )
        self.train_loss.update(loss.detach(), weight=size)
        self.train_padding.update(padding, weight=size)
        if self._logger_writes_this_step():
            self.log("train/loss_step", loss.detach(), on_step=True, on_epoch=False, prog_bar=True, batch_size=size)
            if self.scheduler_interval == "step":  # the rate this step trains with (the scheduler steps after it)
                self.log("train/lr", self._lr(), on_step=True, on_epoch=False, batch_size=size)
        return loss

    def _lr(self) -> float:
        return float(self.trainer.optimizers[0].param_groups[0]["lr"])

    def _logger_writes_this_step(self) -> bool:
        """Lightning's own test: the batches that stepped before this one, plus one, divisible by
        ``log_every_n_steps`` (inside ``training_step`` that count is ``global_step``: the optimizer
        steps after it)."""
        every = self.trainer.log_every_n_steps
        return every > 0 and (self.global_step + 1) % every == 0

    def on_train_epoch_start(self) -> None:
        # read before the epoch's steps: an epoch scheduler steps before ``on_train_epoch_end``
        if self.scheduler_interval != "step":
            self.log("train/lr", self._lr(), on_step=False, on_epoch=True)

    def on_train_epoch_end(self) -> None:
        # MeanMetric syncs across processes itself (DDP): one value per epoch, every sequence once.
        self.log_dict({"train/loss": self.train_loss.compute(), "train/padding_fraction": self.train_padding.compute()})
        self.train_loss.reset()
        self.train_padding.reset()

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.model.parameters(),
                                           full_precision=str(self.trainer.precision) in FULL_PRECISION)
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": self.scheduler_monitor,
                             "interval": self.scheduler_interval},
        }

    # -- evaluation ----------------------------------------------------------------------
    def _evaluate(self, batch: Batch, metrics: MetricSuite, model: Seq2Seq | None = None) -> Tensor:
        """Encode once; decode greedily and run the teacher-forced pass from that encoding (as the
        evaluator does); feed both to the suite. Returns the decoded tokens. ``model``: another model
        scored as this one is (the averaged checkpoints'); the module's own by default."""
        model = self.model if model is None else model
        memory, state = encoded = model.encode(batch.src, batch.src_lengths)
        limit = decode_length_limit(batch.src_lengths, self.decode_ratio, self.decode_extra)
        decoded = greedy_decode(model, batch.src, batch.src_lengths, max_length=limit, encoded=encoded)
        logits, attention = model.decoder(batch.tgt_in, state, memory)  # teacher forced
        loss = self.loss(logits, batch.tgt_out)  # val/loss, test/loss: unsmoothed, comparable across ε
        metrics.update(BatchOutputs.of(batch, decoded.tokens, attention=attention, logits=logits, loss=loss))
        return decoded.tokens

    def evaluate_model(self, model: Seq2Seq, batch: Batch, metrics: MetricSuite) -> None:
        """``model`` scored on ``batch`` into ``metrics`` exactly as validation scores the module's own."""
        self._evaluate(batch, metrics, model)

    def _log_epoch(self, metrics: MetricSuite) -> dict[str, Tensor]:
        values = metrics.compute()
        self.last_bucket_tables[metrics.spec.stage] = metrics.bucket_rows()
        self.log_dict(values, sync_dist=False)  # the suite's metrics synchronise themselves
        metrics.reset()
        return values

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        tokens = self._evaluate(batch, self.val_metrics)
        batches = self.trainer.num_val_batches[0] if self.trainer.num_val_batches else 1
        sampled = sample_batches(int(batches))  # the first, middle and last batch: short to long sources
        if batch_idx == 0:
            self.last_samples = []
        if batch_idx in sampled:
            rank = sampled.index(batch_idx) / max(len(sampled) - 1, 1)  # 0: its shortest source … 1: its longest
            self.last_samples += samples(batch, tokens, self.trainer.datamodule, [rank] if len(sampled) > 1 else None)

    def probe_faithfulness(self) -> None:
        """At every ``faith.every_n_epochs``-th validation (not the sanity check): the faithfulness probe on
        ``faith.samples`` validation sequences (the same each time: spread over the source lengths), into
        the suite (``val/faith/...``)."""
        faith = self.faith
        if faith is None or self.trainer.sanity_checking or (self.current_epoch + 1) % faith.every_n_epochs:
            return
        from attnseq.faithfulness.probe import probe, spread  # torch work beside the suite's

        data = self.trainer.datamodule
        examples = data.val_examples  # the same each validation, so the same sample: no state kept here
        picked = [examples[i] for i in spread([len(e.src) for e in examples], faith.samples)]
        batch = collate(encode_examples(picked, data.src_vocab, data.tgt_vocab)).to(self.device)
        self.val_metrics.update_faithfulness(
            probe(self.model, batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_lengths, faith), faith.alpha)

    def on_validation_epoch_end(self) -> None:
        self.probe_faithfulness()
        values = self._log_epoch(self.val_metrics)
        if "val/acc" in values and not self.trainer.sanity_checking:
            self.val_acc_best(values["val/acc"])
            self.log("val/acc_best", self.val_acc_best.compute())

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_epoch(self.test_metrics)


def token_cross_entropy(logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """``logits (B, T, V)``, ``target (B, T)`` → the cross-entropy's mean over the real (non-PAD) target
    tokens. ``label_smoothing`` ε as torch's ``F.cross_entropy`` defines it: the target distribution is
    (1 − ε) on the gold token plus ε/V on each of the V output tokens (PAD and BOS included), so a
    token's loss is (1 − ε) · (−log p_gold) + ε · the mean over v of (−log p_v); ε = 0 is plain NLL.

    A per-token mean: with ``trainer.accumulate_grad_batches=N`` Lightning divides each batch's loss
    by N, so a step's gradient is the mean of its batches' per-token means, the gradient of one batch
    of all of them exactly when they hold as many real target tokens each (docs/training.md)."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD,
                           label_smoothing=label_smoothing)  # (B·T, V), (B·T,) → ()


SAMPLES = 3
"""Sample outputs kept at each validation."""


def sample_batches(count: int) -> list[int]:
    """The validation batches samples come from: the first, middle and last (batches are grouped by
    length, so these hold short, middle and long sources); fewer when there are fewer batches."""
    return sorted({round(i * (count - 1) / max(SAMPLES - 1, 1)) for i in range(SAMPLES)})


def samples(batch: Batch, tokens: Tensor, data, ranks: list[float] | None = None) -> list[dict]:
    """Examples of a validation batch at ``ranks`` of its source lengths (0: the shortest, 1: the
    longest; by default ``SAMPLES`` from shortest to longest), the same ones every epoch, as text:
    source, reference, hypothesis and whether it is right."""
    order = torch.argsort(batch.src_lengths.cpu(), stable=True).tolist()
    ranks = ranks if ranks is not None else [i / max(SAMPLES - 1, 1) for i in range(SAMPLES)]
    picked = dict.fromkeys(order[round(rank * (len(order) - 1))] for rank in ranks)
    rows = []
    for i in picked:
        source = data.src_tokenizer.detokenize(data.src_vocab.decode(batch.src[i, : batch.src_lengths[i]].tolist()))
        reference = output_text(batch.tgt_out[i].tolist(), data.tgt_vocab, data.tgt_tokenizer)
        hypothesis = output_text(tokens[i].tolist(), data.tgt_vocab, data.tgt_tokenizer)
        rows.append({"source": source, "reference": reference, "hypothesis": hypothesis,
                     "correct": hypothesis == reference})
    return rows
