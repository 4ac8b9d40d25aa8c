"""What every registered metric reports, torch-free: its names, the capabilities it needs, the
stages it reports in, which names are better lower, and the length buckets' names. The config is
checked against these (``checkpoint.monitor`` is a metric the run logs) before torch loads.

A metric is a class that registers itself in ``METRICS`` (an ``attnseq.registry.Registry``) by
subclassing ``MetricDeclaration`` with a ``name``; ``attnseq.metrics.members.SuiteMetric`` adds the
torch side (``update``/``compute``). A built-in one is declared here and computed by its namesake in
``attnseq.metrics.families``, which subclasses it directly and takes its place in the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from attnseq.errors import ConfigError
from attnseq.metrics.faithfulness import faith_names
from attnseq.registry import Registry

FIT_STAGES = ("val", "test")
"""The stages the LightningModule reports; evaluation's is ``eval``, the training step's ``train``."""

METRICS = Registry("metric", "metric", names_options=False)
"""Every registered metric class by name, in the order of registration (built-ins first)."""

RATIOS: dict[str, tuple[str, str]] = {
    "align_acc": ("hits", "gold_steps"),
    "align_acc_near": ("near", "gold_steps"),
    "align_offset": ("offset", "gold_steps"),
    "attn_mass_gold": ("mass", "gold_steps"),
    "align_precision": ("link_hits", "links"),
    "align_recall": ("link_hits", "gold_steps"),
    "attn_entropy": ("entropy", "steps"),
    "attn_margin": ("margin", "steps"),
}
"""Each attention diagnostic as (numerator sum, denominator sum); ``aer`` is derived from three sums."""

DIAGNOSTICS = (*RATIOS, "aer")
"""Every name ``AttentionDiagnostics`` reports."""

SHAPE_DIAGNOSTICS = ("attn_entropy", "attn_margin")
"""The diagnostics that need no gold alignment (every other one does)."""

SCORES = ("sacrebleu", "chrf", "ter")
"""The translation score names, as metric keys use them: ``eval/sacrebleu``, ``eval/chrf_len/01-05``
(``ter`` is better lower: ``Translation.lower_is_better``)."""

MODES = ("permute", "uniform")
"""The counterfactual replacements of the attention: a permutation of its own weights, the uniform one."""


def bucket_bounds(max_length: int, width: int) -> list[tuple[int, int]]:
    """Inclusive length ranges ``(1, w), (w+1, 2w), ...`` covering ``1..max_length``.

    The last bucket ends at ``max_length`` (``bucket_bounds(12, 5) == [(1, 5), (6, 10), (11, 12)]``),
    so no bucket claims lengths the metric would reject.
    """
    if not isinstance(max_length, int) or max_length < 1:
        raise ConfigError(
            f"max_length must be a positive int, got {max_length!r}",
            "pass the longest source length the data can produce.",
        )
    if not isinstance(width, int) or width < 1:
        raise ConfigError(
            f"bucket width must be a positive int, got {width!r}",
            "pass a width such as 5 (buckets 01-05, 06-10, ...).",
        )
    return [(lo, min(lo + width - 1, max_length)) for lo in range(1, max_length + 1, width)]


def bucket_digits(max_length: int) -> int:
    """Digits used to zero-pad bucket names: at least 2, more when ``max_length`` needs them."""
    return max(2, len(str(max_length)))


def bucket_name(lo: int, hi: int, digits: int) -> str:
    """Zero-padded so names sort lexicographically in numeric order: ``"06-10"``, ``"001-005"``."""
    return f"{lo:0{digits}d}-{hi:0{digits}d}"


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
    faith: tuple[str, ...] = ()  # the faithfulness groups the caller probes (``FaithSettings.groups``); (): off
    text_scores: tuple[str, ...] = SCORES  # of a text task: the ones computed (validation: training.val_text_scores)
    to_text: Callable[[Sequence[int]], str] | None = field(default=None, compare=False)
    """Text tasks: a target row of ids, as the sentence it stands for (up to EOS, detokenised)."""

    @property
    def bucket_names(self) -> list[str]:
        digits = bucket_digits(self.max_length)
        return [bucket_name(lo, hi, digits) for lo, hi in bucket_bounds(self.max_length, self.bucket_width)]


class MetricDeclaration:
    """A registered metric (or family of metrics that share their sums), as the config sees it.

    ``overall_names``/``bucket_names`` declare every name it can report for a spec (a bucket name
    ``acc_len`` is reported as ``acc_len/01-05``); by default ``[name]``.
    """

    name: ClassVar[str]
    needs_attention: ClassVar[bool] = False
    needs_gold_alignment: ClassVar[bool] = False
    needs_text: ClassVar[bool] = False
    needs_counterfactual: ClassVar[bool] = False
    needs_faith: ClassVar[bool] = False
    stages: ClassVar[tuple[str, ...]] = (*FIT_STAGES, "eval")
    lower_is_better: ClassVar[bool | tuple[str, ...]] = False
    """True: every name it reports is better lower; or the names that are (the rest: higher)."""
    kept_by_module: ClassVar[bool] = False
    """Named here, computed by the LightningModule itself (across epochs, or in the training step)."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        declared = METRICS.get(getattr(cls, "name", None))
        if "name" in cls.__dict__:
            METRICS.add(cls.name, cls)
        elif declared in cls.__bases__ and not hasattr(declared, "compute"):
            METRICS[cls.name] = cls  # the class that computes a declared-only metric takes its place

    @classmethod
    def applies(cls, spec: SuiteSpec) -> bool:
        """Whether a run described by ``spec`` reports this metric."""
        return (
            spec.stage in cls.stages
            and (spec.attention or not cls.needs_attention)
            and (spec.gold_alignment or not cls.needs_gold_alignment)
            and (spec.text or not cls.needs_text)
            and (spec.counterfactual or not cls.needs_counterfactual)
            and (bool(spec.faith) or not cls.needs_faith)
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


def applicable(spec: SuiteSpec) -> list[type[MetricDeclaration]]:
    return [cls for cls in METRICS.values() if cls.applies(spec)]


def names(spec: SuiteSpec, buckets: bool = True, **capabilities: object) -> list[str]:
    """Every name a ``spec.stage`` of such a run reports, with its stage prefix: the scores of the
    outputs, then those of the attention, then each length bucket's (``buckets=False``: none of those).
    ``capabilities``: of the metrics with those alone (``needs_faith=True``: the faithfulness ones)."""
    classes = [c for c in applicable(spec) if all(getattr(c, k) == v for k, v in capabilities.items())]
    ordered = [c for c in classes if not c.needs_attention] + [c for c in classes if c.needs_attention]
    found = [name for cls in ordered for name in cls.overall_names(spec)]
    for bucket in spec.bucket_names if buckets else ():
        found += [f"{name}/{bucket}" for cls in classes for name in cls.bucket_names(spec)]
    return [f"{spec.stage}/{name}" for name in found]


def lower_is_better(metric: str) -> bool:
    """Whether ``metric`` (``val/aer``, ``train/loss``, ``val/attn_entropy_train_lengths``,
    ``eval/acc_len/01-05``) is better lower, as the registered metric reporting it declares."""
    rest = metric.partition("/")[2]
    base = rest.split("/")[0].removesuffix("_train_lengths").removesuffix("_len")
    path = "/".join(part.removesuffix("_len") for part in rest.split("/") if not part[:1].isdigit())  # no bucket
    return any(cls.is_lower_better(base) or cls.is_lower_better(path) for cls in METRICS.values())


# -- the built-in metrics, in the order they report (computed in attnseq.metrics.families) ----------


class Loss(MetricDeclaration):
    name = "loss"
    stages = FIT_STAGES
    lower_is_better = True


class Accuracy(MetricDeclaration):
    name = "accuracy"

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return ["acc", "exact_match"]

    @classmethod
    def bucket_names(cls, spec: SuiteSpec) -> list[str]:
        return ["acc_len", "exact_len"]


class BestAccuracy(MetricDeclaration):
    """``val/acc_best``: the best ``val/acc`` of the run so far, kept by the LightningModule across
    epochs (and in its checkpoints)."""

    name = "acc_best"
    stages = ("val",)
    kept_by_module = True


class TrainLengthsAccuracy(MetricDeclaration):
    name = "accuracy_train_lengths"

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return ["acc_train_lengths", "exact_match_train_lengths"]


class Diagnostics(MetricDeclaration):
    name = "attention"
    needs_attention = True
    lower_is_better = ("attn_entropy", "aer")

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


class Translation(MetricDeclaration):
    name = "translation"
    needs_text = True
    lower_is_better = ("ter",)  # edits per reference word

    @classmethod
    def applies(cls, spec: SuiteSpec) -> bool:
        return super().applies(spec) and bool(spec.text_scores)

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return list(spec.text_scores)

    @classmethod
    def bucket_names(cls, spec: SuiteSpec) -> list[str]:
        return [] if spec.stage in FIT_STAGES else [f"{name}_len" for name in spec.text_scores]


class Counterfactual(MetricDeclaration):
    name = "counterfactual"
    needs_attention = True
    needs_counterfactual = True
    stages = ("eval",)

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return [f"cf_{mode}_{key}" for mode in MODES for key in ("flip_rate", "tv")]

    @classmethod
    def bucket_names(cls, spec: SuiteSpec) -> list[str]:
        return [f"cf_{mode}_flip_len" for mode in MODES]


class Faithfulness(MetricDeclaration):
    """``faith/...``: the attention against other measures of importance, the counterfactual flip rates and the
    adversarial JSD on a sample of sequences (``faith.*``); in evaluation per bucket too (``..._len/01-05``)."""

    name = "faithfulness"
    needs_attention = True
    needs_faith = True
    lower_is_better = ("faith/adversarial_jsd",)  # a far attention with the same output: less faithful

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return faith_names(spec.faith)

    @classmethod
    def bucket_names(cls, spec: SuiteSpec) -> list[str]:
        return [] if spec.stage in FIT_STAGES else [f"{name}_len" for name in faith_names(spec.faith)]


class Training(MetricDeclaration):
    """``train/loss`` and ``train/padding_fraction``: epoch means the LightningModule's training step
    accumulates (it decodes nothing); ``train/lr``: the learning rate the epoch trained with (under a
    schedule stepped per optimizer step, ``scheduler.interval: step``, each logged step's)."""

    name = "training"
    stages = ("train",)
    kept_by_module = True
    lower_is_better = ("loss", "padding_fraction")

    @classmethod
    def overall_names(cls, spec: SuiteSpec) -> list[str]:
        return ["loss", "padding_fraction", "lr"]
