"""The built-in metrics of ``MetricSuite``, in the order they report: the teacher-forced loss,
accuracy and exact match (per length bucket, and inside the training lengths), the attention
diagnostics, sacreBLEU/chrF and the counterfactual check. Fit (``val/``, ``test/``) reports
alignment accuracy per bucket; evaluation every diagnostic and score per bucket, as table columns."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from attnseq.metrics.alignment import DIAGNOSTICS, SHAPE_DIAGNOSTICS, AttentionDiagnostics
from attnseq.metrics.counterfactual import MODES, CounterfactualTotals
from attnseq.metrics.length_buckets import LengthBucketedAccuracy
from attnseq.metrics.suite import FIT_STAGES, BatchOutputs, SuiteMetric, SuiteSpec
from attnseq.metrics.translation import SCORES, corpus_scores, translation_scores


def _inside(outputs: BatchOutputs, *tensors: Tensor) -> list[Tensor]:
    """The rows of ``tensors`` whose source length is a training length."""
    return [tensor[outputs.inside] for tensor in tensors]


class BatchWeightedMean(Metric):
    """The mean of per-batch values, each weighed by its batch size, summed as Lightning sums an
    ``on_epoch`` ``self.log`` (float32 total, integer count): the same number, with no NaN test
    (a host sync) per step. torchmetrics' ``MeanMetric(nan_strategy="disable")`` drops the weights."""

    full_state_update = False
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.get_default_dtype()), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, value: Tensor, size: int) -> None:
        if value.dtype not in (torch.float32, torch.float64):
            value = value.to(torch.get_default_dtype())
        self.total = self.total + value * size
        self.count = self.count + size

    def compute(self) -> Tensor:
        return self.total / self.count


class Loss(SuiteMetric):
    """Teacher-forced cross-entropy: each batch's mean over its real tokens, averaged over the
    stage's batches weighed by their sizes (as ``self.log(..., on_epoch=True)`` averaged it)."""

    name = "loss"
    stages = FIT_STAGES
    lower_is_better = True

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        self.mean = BatchWeightedMean()

    def update(self, outputs: BatchOutputs) -> None:
        self.mean.update(outputs.loss.detach(), outputs.target.shape[0])

    def compute(self) -> dict[str, Tensor]:
        return {"loss": self.mean.compute()}


class Accuracy(SuiteMetric):
    """Token accuracy and exact match of the decoded outputs, overall and per source-length bucket
    (``LengthBucketedAccuracy``); its bucket table is the one every other metric adds columns to."""

    name = "accuracy"

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        self.buckets = LengthBucketedAccuracy(spec.max_length, spec.bucket_width)

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return ["acc", "exact_match"]

    @classmethod
    def bucket_names(cls, spec: SuiteSpec) -> list[str]:
        return ["acc_len", "exact_len"]

    def update(self, outputs: BatchOutputs) -> None:
        self.buckets.update(outputs.predictions, outputs.target, outputs.target_lengths, outputs.src_lengths)

    def compute(self) -> dict[str, Tensor]:
        return self.buckets.compute()

    def bucket_columns(self) -> list[dict]:
        return self.buckets.bucket_table()


class BestAccuracy(SuiteMetric):
    """``val/acc_best``: the best ``val/acc`` of the run so far, kept by the LightningModule across
    epochs (and in its checkpoints)."""

    name = "acc_best"
    stages = ("val",)
    kept_by_module = True


class TrainLengthsAccuracy(SuiteMetric):
    """Accuracy and exact match of the sequences whose source length is a training length."""

    name = "accuracy_train_lengths"

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        hi = spec.train_lengths[1]
        self.inside = LengthBucketedAccuracy(hi, hi)  # one bucket: every seen length

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return ["acc_train_lengths", "exact_match_train_lengths"]

    def update(self, outputs: BatchOutputs) -> None:
        self.inside.update(
            *_inside(outputs, outputs.predictions, outputs.target, outputs.target_lengths, outputs.src_lengths)
        )

    def compute(self) -> dict[str, Tensor]:
        inside = self.inside.compute()
        return {f"{key}_train_lengths": inside[key] for key in ("acc", "exact_match") if key in inside}


class Diagnostics(SuiteMetric):
    """The attention diagnostics of ``attnseq.metrics.alignment`` (those needing a gold alignment
    only where the task has one), overall, inside the training lengths and per bucket."""

    name = "attention"
    needs_attention = True
    lower_is_better = ("attn_entropy", "aer")

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        hi = spec.train_lengths[1]
        self.overall = AttentionDiagnostics(spec.max_length, spec.bucket_width)
        self.inside = AttentionDiagnostics(hi, hi)

    @staticmethod
    def diagnostics(spec: SuiteSpec) -> list[str]:
        return [d for d in DIAGNOSTICS if spec.gold_alignment or d in SHAPE_DIAGNOSTICS]

    @classmethod
    def per_bucket(cls, spec: SuiteSpec) -> tuple[str, ...]:
        """Fit logs alignment accuracy per bucket (each epoch's metric count stays small);
        evaluation every diagnostic."""
        return ("align_acc",) if spec.stage in FIT_STAGES else DIAGNOSTICS

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return [f"{d}{inside}" for d in cls.diagnostics(spec) for inside in ("", "_train_lengths")]

    @classmethod
    def bucket_names(cls, spec: SuiteSpec) -> list[str]:
        return [f"{d}_len" for d in cls.per_bucket(spec) if d in cls.diagnostics(spec)]

    def update(self, outputs: BatchOutputs) -> None:
        self.overall.update(outputs.attention, outputs.alignment, outputs.target_lengths, outputs.src_lengths)
        self.inside.update(
            *_inside(outputs, outputs.attention, outputs.alignment, outputs.target_lengths, outputs.src_lengths)
        )

    def compute(self) -> dict[str, Tensor | float]:
        values: dict[str, Tensor | float] = dict(self.overall.compute())
        values.update({f"{name}_train_lengths": value for name, value in self.inside.compute().items()})
        for row in self.overall.bucket_table():
            for name in self.per_bucket(self.spec):
                if row[name] is not None:
                    values[f"{name}_len/{row['bucket']}"] = row[name]
        return values

    def bucket_columns(self) -> list[dict] | None:
        if self.spec.stage in FIT_STAGES:
            return None
        return [{name: row[name] for name in DIAGNOSTICS} for row in self.overall.bucket_table()]


class Translation(SuiteMetric):
    """sacreBLEU and chrF of the detokenised outputs against the references (``spec.to_text`` of the
    targets unless the caller gives the examples' own text), pooled over every process's sentences;
    in evaluation per bucket too."""

    name = "translation"
    needs_text = True

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        self.batches: list[tuple[Tensor, Tensor, Tensor, Tensor, list[str] | None]] = []
        self.table: list[dict] | None = None  # evaluation: the latest compute()'s rows, for bucket_columns

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return list(SCORES)

    @classmethod
    def bucket_names(cls, spec: SuiteSpec) -> list[str]:
        return [] if spec.stage in FIT_STAGES else [f"{name}_len" for name in SCORES]

    def update(self, outputs: BatchOutputs) -> None:
        references = None if outputs.references is None else list(outputs.references)
        self.batches.append(
            (outputs.predictions, outputs.target, outputs.target_lengths, outputs.src_lengths, references)
        )

    def sentences(self) -> tuple[list[str], list[str], list[int]]:
        """The hypotheses, references and source lengths of every batch so far, in order."""
        to_text = self.spec.to_text
        hypotheses, references, lengths = [], [], []
        for predictions, target, target_lengths, src_lengths, given in self.batches:
            hypotheses += [to_text(row) for row in predictions.tolist()]
            if given is None:
                given = [to_text(gold[:n]) for gold, n in zip(target.tolist(), target_lengths.tolist())]
            references += given
            lengths += src_lengths.tolist()
        return hypotheses, references, lengths

    def compute(self) -> dict[str, Tensor | float]:
        if not self.batches:
            return {}
        hypotheses, references, lengths = self.sentences()
        if self.spec.stage in FIT_STAGES:
            hypotheses, references = _gathered(hypotheses, references)
            return {name: torch.tensor(score) for name, score in corpus_scores(hypotheses, references).items()}
        scores = translation_scores(hypotheses, references, lengths, self.spec.buckets)
        self.table = scores.buckets
        values: dict[str, Tensor | float] = dict(scores.overall)
        for row in scores.buckets:
            values.update({f"{name}_len/{row['bucket']}": row[name] for name in SCORES if row[name] is not None})
        return values

    def bucket_columns(self) -> list[dict] | None:
        return None if self.table is None else [{name: row[name] for name in SCORES} for row in self.table]

    def reset(self) -> None:
        self.batches, self.table = [], None


def _gathered(hypotheses: list[str], references: list[str]) -> tuple[list[str], list[str]]:
    """Every process's sentences, in rank order, under data parallelism; these alone otherwise."""
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()) or distributed.get_world_size() == 1:
        return hypotheses, references
    gathered: list = [None] * distributed.get_world_size()
    distributed.all_gather_object(gathered, (hypotheses, references))
    return [text for part, _ in gathered for text in part], [text for _, part in gathered for text in part]


class Counterfactual(SuiteMetric):
    """How far the outputs move when the attention is replaced (``attnseq.evaluation.counterfactual``):
    flip rate and total variation per mode, overall and per bucket. Evaluation only: the caller
    gives the replayed logits."""

    name = "counterfactual"
    needs_attention = True
    needs_counterfactual = True
    stages = ("eval",)

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        self.totals = self.empty()

    def empty(self) -> dict[str, CounterfactualTotals]:
        return {mode: CounterfactualTotals.empty(self.spec.max_length, self.spec.bucket_width) for mode in MODES}

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return [f"cf_{mode}_{key}" for mode in MODES for key in ("flip_rate", "tv")]

    @classmethod
    def bucket_names(cls, spec: SuiteSpec) -> list[str]:
        return [f"cf_{mode}_flip_len" for mode in MODES]

    def update(self, outputs: BatchOutputs) -> None:
        for mode, total in self.totals.items():
            total.update(
                outputs.logits, outputs.replayed[mode], outputs.target_lengths, outputs.src_lengths,
                self.spec.bucket_width,
            )

    def compute(self) -> dict[str, float]:
        values = {}
        names = self.spec.buckets.names
        for mode, total in self.totals.items():
            values.update({f"cf_{mode}_{key}": value for key, value in total.summary().items()})
            values.update({f"cf_{mode}_flip_len/{name}": row["flip_rate"] for name, row in zip(names, total.rows())
                           if row["flip_rate"] is not None})
        return values

    def bucket_columns(self) -> list[dict]:
        columns: list[dict] = [{} for _ in self.spec.buckets.names]
        for mode, total in self.totals.items():
            for column, row in zip(columns, total.rows()):
                column[f"cf_{mode}_flip_rate"], column[f"cf_{mode}_tv"] = row["flip_rate"], row["tv"]
        return columns

    def reset(self) -> None:
        self.totals = self.empty()


class Training(SuiteMetric):
    """``train/loss`` and ``train/padding_fraction``: epoch means the LightningModule's training step
    accumulates (it decodes nothing)."""

    name = "training"
    stages = ("train",)
    kept_by_module = True
    lower_is_better = ("loss", "padding_fraction")

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return ["loss", "padding_fraction"]
