"""One metrics suite for validation, test and evaluation, built from registered metrics.

A metric, or a family of metrics that share their sums, is a class that registers itself by
subclassing ``SuiteMetric`` with a ``name``, and declares on the class what it needs (attention,
a gold alignment, sentences, the counterfactual replays), the stages it reports in and which of
its names are better lower. ``MetricSuite(spec)`` holds the registered metrics the run described
by ``spec`` can report; the LightningModule (``val/``, ``test/``) and ``evaluate.py``'s evaluator
(``eval/``) each feed it ``BatchOutputs`` and read ``compute()``. ``names(spec)`` (what a
monitor may name) is derived from the same classes: the scores of the outputs, then those of the
attention, then each length bucket's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from torch import Tensor, nn

from attnseq.metrics.length_buckets import LengthBuckets

FIT_STAGES = ("val", "test")
"""The stages the LightningModule reports; evaluation's is ``eval``, the training step's ``train``."""

METRICS: dict[str, type[SuiteMetric]] = {}
"""Every registered metric class by name, in the order of registration (built-ins first)."""


@dataclass(frozen=True)
class SuiteSpec:
    """What one stage of one run can measure: the config's lengths and the task's and model's
    capabilities."""

    stage: str  # val, test, eval or train
    max_length: int  # the longest source length evaluated: the last bucket's end
    bucket_width: int
    train_lengths: tuple[int, int]
    attention: bool  # the model has an attention to diagnose
    gold_alignment: bool  # the task's examples carry a gold alignment
    text: bool  # the task's outputs are sentences (sacreBLEU, chrF)
    counterfactual: bool = False  # the caller replays the attention (evaluation's eval.counterfactual)
    to_text: Callable[[Sequence[int]], str] | None = field(default=None, compare=False)
    """Text tasks: a target row of ids, as the sentence it stands for (up to EOS, detokenised)."""

    @property
    def buckets(self) -> LengthBuckets:
        return LengthBuckets(self.max_length, self.bucket_width)


@dataclass(frozen=True)
class BatchOutputs:
    """What one evaluated batch gives the metrics, batch-first. ``of`` reads a ``Batch``."""

    target: Tensor  # (B, T_tgt) gold [y1..yn, EOS] then PAD
    target_lengths: Tensor  # (B,) n + 1
    src_lengths: Tensor  # (B,)
    alignment: Tensor  # (B, T_tgt) gold source position per target token, -1 where none
    predictions: Tensor  # (B, T_pred) decoded ids, PAD after EOS
    attention: Tensor | None = None  # (B, H, T_tgt, T_enc) teacher forced
    logits: Tensor | None = None  # (B, T_tgt, V) teacher forced
    loss: Tensor | None = None  # () teacher-forced cross-entropy, mean over real tokens
    replayed: Mapping[str, Tensor] = field(default_factory=dict)  # counterfactual logits (B, T_tgt, V) by mode
    references: Sequence[str] | None = None  # text tasks: each row's reference; None: read from target
    inside: Tensor | None = None  # (B,) bool, set by the suite: the source length is a training length

    @classmethod
    def of(cls, batch, predictions: Tensor, **outputs) -> BatchOutputs:
        return cls(batch.tgt_out, batch.tgt_lengths, batch.src_lengths, batch.alignment, predictions, **outputs)


class SuiteMetric(nn.Module):
    """A registered metric (or family): ``update`` per batch, ``compute`` per epoch or evaluation.

    ``compute()`` returns the values by name without the stage prefix; a name with nothing to
    average is left out. ``overall_names``/``bucket_names`` declare every name it can report for a
    spec (a bucket name ``acc_len`` is reported as ``acc_len/01-05``); by default ``[name]``.
    States are torchmetrics ``Metric``s (summed across processes) or reset by ``reset``.
    """

    name: ClassVar[str]
    needs_attention: ClassVar[bool] = False
    needs_gold_alignment: ClassVar[bool] = False
    needs_text: ClassVar[bool] = False
    needs_counterfactual: ClassVar[bool] = False
    stages: ClassVar[tuple[str, ...]] = (*FIT_STAGES, "eval")
    lower_is_better: ClassVar[bool | tuple[str, ...]] = False
    """True: every name it reports is better lower; or the names that are (the rest: higher)."""
    kept_by_module: ClassVar[bool] = False
    """Named here, computed by the LightningModule itself (across epochs, or in the training step)."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name is None:
            return
        if name in METRICS:
            raise TypeError(f"metric name {name!r} is taken by {METRICS[name].__qualname__}: pick another name")
        METRICS[name] = cls

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__()
        self.spec = spec

    @classmethod
    def applies(cls, spec: SuiteSpec) -> bool:
        """Whether a run described by ``spec`` reports this metric."""
        return (
            spec.stage in cls.stages
            and (spec.attention or not cls.needs_attention)
            and (spec.gold_alignment or not cls.needs_gold_alignment)
            and (spec.text or not cls.needs_text)
            and (spec.counterfactual or not cls.needs_counterfactual)
        )

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return [cls.name]

    @classmethod
    def bucket_names(cls, spec: SuiteSpec) -> list[str]:
        return []

    @classmethod
    def is_lower_better(cls, base: str) -> bool:
        """Whether ``base`` (a name without stage, bucket or ``_train_lengths``) is one of this
        metric's that is better lower."""
        declared = cls.lower_is_better
        return base == cls.name if declared is True else bool(declared) and base in declared

    def update(self, outputs: BatchOutputs) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define update(outputs)")

    def compute(self) -> dict[str, Tensor | float]:
        raise NotImplementedError(f"{type(self).__name__} must define compute()")

    def bucket_columns(self) -> list[dict] | None:
        """Evaluation's bucket table: this metric's columns, one dict per bucket; None: none."""
        return None

    def reset(self) -> None:
        for module in self.modules():
            if module is not self and hasattr(module, "reset"):
                module.reset()


def applicable(spec: SuiteSpec) -> list[type[SuiteMetric]]:
    return [cls for cls in METRICS.values() if cls.applies(spec)]


def names(spec: SuiteSpec) -> list[str]:
    """Every name a ``spec.stage`` of such a run reports, with its stage prefix: the scores of the
    outputs, then those of the attention, then each length bucket's."""
    classes = applicable(spec)
    ordered = [c for c in classes if not c.needs_attention] + [c for c in classes if c.needs_attention]
    found = [name for cls in ordered for name in cls.overall_names(spec)]
    for bucket in spec.buckets.names:
        found += [f"{name}/{bucket}" for cls in classes for name in cls.bucket_names(spec)]
    return [f"{spec.stage}/{name}" for name in found]


def lower_is_better(metric: str) -> bool:
    """Whether ``metric`` (``val/aer``, ``train/loss``, ``val/attn_entropy_train_lengths``,
    ``eval/acc_len/01-05``) is better lower, as the registered metric reporting it declares."""
    base = metric.partition("/")[2].split("/")[0].removesuffix("_train_lengths").removesuffix("_len")
    return any(cls.is_lower_better(base) for cls in METRICS.values())


class MetricSuite(nn.Module):
    """The registered metrics ``spec``'s run reports, fed together: ``update`` once per batch,
    ``compute`` (prefixed by the stage) and ``bucket_rows`` at the end, then ``reset``."""

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__()
        self.spec = spec
        self.members = nn.ModuleDict(
            {cls.name: cls(spec) for cls in applicable(spec) if not cls.kept_by_module}
        )

    def names(self) -> list[str]:
        return names(self.spec)

    def lower_is_better(self, name: str) -> bool:
        return lower_is_better(name)

    def update(self, outputs: BatchOutputs) -> None:
        lo, hi = self.spec.train_lengths
        inside = (outputs.src_lengths >= lo) & (outputs.src_lengths <= hi)  # (B,)
        outputs = replace(outputs, inside=inside)
        for member in self.members.values():
            member.update(outputs)

    def compute(self) -> dict[str, Tensor | float]:
        """Every member's values, named ``<stage>/<name>``."""
        stage = self.spec.stage
        return {
            f"{stage}/{name}": value for member in self.members.values() for name, value in member.compute().items()
        }

    def bucket_rows(self) -> list[dict]:
        """One row per length bucket: the accuracy's ``bucket_table`` and, in evaluation, every
        member's columns."""
        rows: list[dict] = []
        for member in self.members.values():
            columns = member.bucket_columns()
            if columns is None:
                continue
            if not rows:
                rows = [dict(row) for row in columns]
            else:
                for row, extra in zip(rows, columns, strict=True):
                    row.update(extra)
        return rows

    def reset(self) -> None:
        for member in self.members.values():
            member.reset()
