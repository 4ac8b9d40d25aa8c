"""The built-in metrics of ``MetricSuite``, in the order they report: the teacher-forced loss,
accuracy and exact match (per length bucket, and inside the training lengths), the attention
diagnostics, sacreBLEU/chrF and the counterfactual check. Fit (``val/``, ``test/``) reports
alignment accuracy per bucket; evaluation every diagnostic and score per bucket, as table columns."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from attnseq.metrics import declarations as declared
from attnseq.metrics.alignment import AttentionDiagnostics
from attnseq.metrics.counterfactual import CounterfactualTotals
from attnseq.metrics.declarations import DIAGNOSTICS, FIT_STAGES, MODES, SCORES, SuiteSpec
from attnseq.metrics.faithfulness import FaithRecords
from attnseq.metrics.length_buckets import LengthBucketedAccuracy, LengthBuckets
from attnseq.metrics.members import BatchOutputs, SuiteMetric
from attnseq.metrics.translation import corpus_scores, translation_scores


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


class Loss(SuiteMetric, declared.Loss):
    """Teacher-forced cross-entropy: each batch's mean over its real tokens, averaged over the
    stage's batches weighed by their sizes (as ``self.log(..., on_epoch=True)`` averaged it)."""

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        self.mean = BatchWeightedMean()

    def update(self, outputs: BatchOutputs) -> None:
        self.mean.update(outputs.loss.detach(), outputs.target.shape[0])

    def compute(self) -> dict[str, Tensor]:
        return {"loss": self.mean.compute()}


class Accuracy(SuiteMetric, declared.Accuracy):
    """Token accuracy and exact match of the decoded outputs, overall and per source-length bucket
    (``LengthBucketedAccuracy``); its bucket table is the one every other metric adds columns to."""

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        self.buckets = LengthBucketedAccuracy(spec.max_length, spec.bucket_width)

    def update(self, outputs: BatchOutputs) -> None:
        self.buckets.update(outputs.predictions, outputs.target, outputs.target_lengths, outputs.src_lengths)

    def compute(self) -> dict[str, Tensor]:
        return self.buckets.compute()

    def bucket_columns(self) -> list[dict]:
        return self.buckets.bucket_table()


class TrainLengthsAccuracy(SuiteMetric, declared.TrainLengthsAccuracy):
    """Accuracy and exact match of the sequences whose source length is a training length."""

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        hi = spec.train_lengths[1]
        self.inside = LengthBucketedAccuracy(hi, hi)  # one bucket: every seen length

    def update(self, outputs: BatchOutputs) -> None:
        self.inside.update(
            *_inside(outputs, outputs.predictions, outputs.target, outputs.target_lengths, outputs.src_lengths)
        )

    def compute(self) -> dict[str, Tensor]:
        inside = self.inside.compute()
        return {f"{key}_train_lengths": inside[key] for key in ("acc", "exact_match") if key in inside}


class Diagnostics(SuiteMetric, declared.Diagnostics):
    """The attention diagnostics of ``attnseq.metrics.alignment`` (those needing a gold alignment
    only where the task has one), overall, inside the training lengths and per bucket."""

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        hi = spec.train_lengths[1]
        self.overall = AttentionDiagnostics(spec.max_length, spec.bucket_width)
        self.inside = AttentionDiagnostics(hi, hi)

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


class Translation(SuiteMetric, declared.Translation):
    """sacreBLEU, chrF and TER of the detokenised outputs against the references (``spec.to_text`` of the
    targets unless the caller gives the examples' own text), pooled over every process's sentences;
    in evaluation per bucket too."""

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        self.batches: list[tuple[Tensor, Tensor, Tensor, Tensor, list[str] | None]] = []
        self.table: list[dict] | None = None  # evaluation: the latest compute()'s rows, for bucket_columns

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
            found = corpus_scores(hypotheses, references, scores=self.spec.text_scores)  # TER only when asked
            return {name: torch.tensor(score) for name, score in found.items()}
        scores = translation_scores(hypotheses, references, lengths, buckets_of(self.spec))
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


class Counterfactual(SuiteMetric, declared.Counterfactual):
    """How far the outputs move when the attention is replaced (``attnseq.faithfulness.counterfactual``):
    flip rate and total variation per mode, overall and per bucket. Evaluation only: the caller
    gives the replayed logits."""

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        self.totals = self.empty()

    def empty(self) -> dict[str, CounterfactualTotals]:
        return {mode: CounterfactualTotals.empty(self.spec.max_length, self.spec.bucket_width) for mode in MODES}

    def update(self, outputs: BatchOutputs) -> None:
        for mode, total in self.totals.items():
            total.update(
                outputs.logits, outputs.replayed[mode], outputs.target_lengths, outputs.src_lengths,
                self.spec.bucket_width,
            )

    def compute(self) -> dict[str, float]:
        values = {}
        names = self.spec.bucket_names
        for mode, total in self.totals.items():
            values.update({f"cf_{mode}_{key}": value for key, value in total.summary().items()})
            values.update({f"cf_{mode}_flip_len/{name}": row["flip_rate"] for name, row in zip(names, total.rows())
                           if row["flip_rate"] is not None})
        return values

    def bucket_columns(self) -> list[dict]:
        columns: list[dict] = [{} for _ in self.spec.bucket_names]
        for mode, total in self.totals.items():
            for column, row in zip(columns, total.rows()):
                column[f"cf_{mode}_flip_rate"], column[f"cf_{mode}_tv"] = row["flip_rate"], row["tv"]
        return columns

    def reset(self) -> None:
        self.totals = self.empty()


class Faithfulness(SuiteMetric, declared.Faithfulness):
    """The faithfulness probe's records (``MetricSuite.update_faithfulness``: the caller runs the model on its
    sample of sequences, ``attnseq.faithfulness.probe``), summarised as ``faith/...``; in evaluation per
    source-length bucket too. A batch of the other metrics adds nothing."""

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__(spec)
        self.records = FaithRecords([], [], [])
        self.alpha = 0.05

    def update(self, outputs: BatchOutputs) -> None:
        pass

    def add(self, records: FaithRecords, alpha: float = 0.05) -> None:
        self.records.extend(records)
        self.alpha = alpha

    def compute(self) -> dict[str, float]:
        values = {f"faith/{name}": value for name, value in self.records.summary(self.alpha).items()}
        if self.spec.stage not in FIT_STAGES:
            buckets = buckets_of(self.spec)
            for name, (lo, hi) in zip(buckets.names, buckets.bounds):
                values.update({f"faith/{key}_len/{name}": value
                               for key, value in self.records.summary(self.alpha, lo, hi).items()})
        return values

    def reset(self) -> None:
        self.records = FaithRecords([], [], [])


def buckets_of(spec: SuiteSpec) -> LengthBuckets:
    """The ``LengthBuckets`` that assign each of ``spec``'s sequences its bucket."""
    return LengthBuckets(spec.max_length, spec.bucket_width)
