"""The LightningModule around ``Seq2Seq``: loss, optimisation, and the validation metrics.

Metrics are updated on tensors (no host syncs in the steps) and logged once per epoch:
``train/loss`` and ``train/padding_fraction`` (means over the epoch's sequences, accumulated in
``MeanMetric``s: a ``self.log`` call costs Python time a small model's step cannot spare),
``train/loss_step`` only on the steps the logger writes (every ``trainer.log_every_n_steps``),
``val/loss``, ``val/acc``, ``val/exact_match``, ``val/acc_best``, every length bucket
(``val/acc_len/01-05``, ``val/exact_len/01-05``, …), the same restricted to the training lengths
(``val/acc_train_lengths``, ``val/exact_match_train_lengths``) and, for models with attention,
the attention diagnostics of ``attnseq.metrics.alignment`` (``val/align_acc``, ``val/align_acc_near``,
``val/align_offset``, ``val/attn_mass_gold``, ``val/attn_entropy``, ``val/attn_margin``, …; those
needing a gold alignment only on tasks that have one), each also inside the training lengths
(``val/align_acc_train_lengths``, …), alignment accuracy per bucket (``val/align_acc_len/01-05``)
and, for tasks whose outputs are sentences (``TEXT_TASKS``), sacreBLEU and chrF on detokenised text
(``val/sacrebleu``, ``val/chrf``: ``attnseq.metrics.translation``). Their references are the targets
as the target vocabulary spells them, so a token outside it reads ``<unk>`` there; evaluation
(``eval/sacrebleu``) scores against the examples' own text. ``test/…`` likewise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import lightning as L
import torch
from torch import Tensor
from torch.nn import functional as F
from torchmetrics import MaxMetric, MeanMetric, MetricCollection

from attnseq.data.batch import Batch
from attnseq.data.tokenizers import TEXT_TASKS, output_text
from attnseq.data.vocab import PAD
from attnseq.metrics import AttentionDiagnostics, LengthBucketedAccuracy
from attnseq.metrics.translation import corpus_scores
from attnseq.model import Seq2Seq, greedy_decode

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], object]


def decode_length_limit(src_lengths: Tensor, ratio: float, extra: int) -> int:
    """How many tokens greedy decoding may emit for a batch: ``ratio × longest source + extra``."""
    return int(int(src_lengths.max()) * ratio) + extra


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
        decode_ratio: float = 1.5,
        decode_extra: int = 5,
        scheduler_monitor: str = "val/loss",
    ) -> None:
        super().__init__()
        self.model = model
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_monitor = scheduler_monitor
        self.train_lengths = tuple(train_lengths)
        self.teacher_forcing = teacher_forcing
        self.decode_ratio = decode_ratio
        self.decode_extra = decode_extra
        _, hi = self.train_lengths
        self.val_metrics = MetricCollection(
            {
                "buckets": LengthBucketedAccuracy(max_eval_length, bucket_width),
                "train_lengths": LengthBucketedAccuracy(hi, hi),  # one bucket: every seen length
                "attention": AttentionDiagnostics(max_eval_length, bucket_width),
                "attention_train_lengths": AttentionDiagnostics(hi, hi),
            },
            compute_groups=False,
        )
        self.test_metrics = self.val_metrics.clone()
        # nan_strategy="disable": no NaN test (a host sync) per step; FiniteLossGuard stops a NaN loss
        self.train_loss = MeanMetric(nan_strategy="disable")
        self.train_padding = MeanMetric(nan_strategy="disable")
        self.val_acc_best = MaxMetric()
        for metric in (self.val_metrics, self.test_metrics, self.train_loss, self.train_padding, self.val_acc_best):
            metric.persistent(True)  # in the checkpoint: a resumed run keeps its best and its running means
        self.last_bucket_tables: dict[str, list[dict]] = {}
        """The latest epoch's per-bucket rows, by stage: read by the tracking callbacks."""
        self.epoch_outputs: dict[str, list[tuple[Tensor, Tensor, Tensor]]] = {}
        """This epoch's (decoded ids, target ids, target lengths) of each batch, by stage, for text tasks:
        sacreBLEU and chrF pool the whole epoch's sentences. Emptied by each epoch's end."""

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
    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD)  # mean over real tokens

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        logits, _ = self.model(batch.src, batch.src_lengths, batch.tgt_in, teacher_forcing=self.teacher_forcing)
        loss = self.loss(logits, batch.tgt_out)
        size = len(batch)
        padding = 1.0 - (batch.src_lengths.sum() + batch.tgt_lengths.sum()) / (
            batch.src.numel() + batch.tgt_out.numel()
        )
        self.train_loss.update(loss.detach(), weight=size)
        self.train_padding.update(padding, weight=size)
        if self._logger_writes_this_step():
            self.log("train/loss_step", loss.detach(), on_step=True, on_epoch=False, prog_bar=True, batch_size=size)
        return loss

    def _logger_writes_this_step(self) -> bool:
        """Lightning's own test (``_batches_that_stepped + 1`` divisible by ``log_every_n_steps``),
        read through the public ``global_step``: equal to it with one optimizer."""
        every = self.trainer.log_every_n_steps
        return every > 0 and (self.global_step + 1) % every == 0

    def on_train_epoch_end(self) -> None:
        # MeanMetric syncs across processes itself (DDP): one value per epoch, every sequence once.
        self.log_dict({"train/loss": self.train_loss.compute(), "train/padding_fraction": self.train_padding.compute()})
        self.train_loss.reset()
        self.train_padding.reset()

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.model.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": self.scheduler_monitor, "interval": "epoch"},
        }

    # -- evaluation ----------------------------------------------------------------------
    def _evaluate(self, batch: Batch, metrics: MetricCollection, stage: str) -> None:
        logits, attention = self.model(batch.src, batch.src_lengths, batch.tgt_in)  # teacher forced
        self.log(
            f"{stage}/loss", self.loss(logits, batch.tgt_out), on_epoch=True, batch_size=len(batch), sync_dist=True
        )
        limit = decode_length_limit(batch.src_lengths, self.decode_ratio, self.decode_extra)
        decoded = greedy_decode(self.model, batch.src, batch.src_lengths, max_length=limit)
        metrics["buckets"].update(decoded.tokens, batch.tgt_out, batch.tgt_lengths, batch.src_lengths)
        lo, hi = self.train_lengths
        seen = (batch.src_lengths >= lo) & (batch.src_lengths <= hi)  # (B,)
        metrics["train_lengths"].update(
            decoded.tokens[seen], batch.tgt_out[seen], batch.tgt_lengths[seen], batch.src_lengths[seen]
        )
        if attention is not None:
            metrics["attention"].update(attention, batch.alignment, batch.tgt_lengths, batch.src_lengths)
            metrics["attention_train_lengths"].update(
                attention[seen], batch.alignment[seen], batch.tgt_lengths[seen], batch.src_lengths[seen]
            )
        if self._outputs_are_sentences():
            self.epoch_outputs.setdefault(stage, []).append((decoded.tokens, batch.tgt_out, batch.tgt_lengths))

    def _outputs_are_sentences(self) -> bool:
        data = self.trainer.datamodule
        return data is not None and getattr(data, "task", None) in TEXT_TASKS

    def _translation_scores(self, stage: str) -> dict[str, Tensor]:
        """sacreBLEU and chrF of the epoch's outputs (every process's, under data parallelism)."""
        outputs = self.epoch_outputs.pop(stage, [])
        if not outputs:
            return {}
        data = self.trainer.datamodule
        hypotheses, references = [], []
        for decoded, target, target_lengths in outputs:
            for out_ids, gold_ids, length in zip(decoded.tolist(), target.tolist(), target_lengths.tolist()):
                hypotheses.append(output_text(out_ids, data.tgt_vocab, data.tgt_tokenizer))
                references.append(output_text(gold_ids[:length], data.tgt_vocab, data.tgt_tokenizer))
        if self.trainer.world_size > 1:
            gathered: list = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(gathered, (hypotheses, references))
            hypotheses = [text for part, _ in gathered for text in part]
            references = [text for _, part in gathered for text in part]
        return {f"{stage}/{name}": torch.tensor(score) for name, score in corpus_scores(hypotheses, references).items()}

    def _log_epoch(self, metrics: MetricCollection, stage: str) -> dict[str, Tensor]:
        values = {f"{stage}/{name}": value for name, value in metrics["buckets"].compute().items()}
        seen = metrics["train_lengths"].compute()
        if seen:
            values[f"{stage}/acc_train_lengths"] = seen["acc"]
            values[f"{stage}/exact_match_train_lengths"] = seen["exact_match"]
        if self.model.attention is not None:
            values.update({f"{stage}/{name}": value for name, value in metrics["attention"].compute().items()})
            inside = metrics["attention_train_lengths"].compute()
            values.update({f"{stage}/{name}_train_lengths": value for name, value in inside.items()})
            for row in metrics["attention"].bucket_table():
                if row["align_acc"] is not None:
                    values[f"{stage}/align_acc_len/{row['bucket']}"] = torch.tensor(row["align_acc"])
        values.update(self._translation_scores(stage))
        self.last_bucket_tables[stage] = metrics["buckets"].bucket_table()
        self.log_dict(values, sync_dist=False)
        metrics.reset()
        return values

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics, "val")

    def on_validation_epoch_end(self) -> None:
        values = self._log_epoch(self.val_metrics, "val")
        if "val/acc" in values and not self.trainer.sanity_checking:
            self.val_acc_best(values["val/acc"])
            self.log("val/acc_best", self.val_acc_best.compute())

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics, "test")

    def on_test_epoch_end(self) -> None:
        self._log_epoch(self.test_metrics, "test")
