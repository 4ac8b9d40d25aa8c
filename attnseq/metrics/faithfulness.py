"""Does the attention agree with other measures of importance? (Jain & Wallace 2019, §4.1): per decoder step,
Kendall's τ between the attention over the real source positions and an importance measure, its p-value, and
whether both put the same position first. The measures themselves (gradient × input, integrated gradients,
leave-one-out) are computed from a model by ``attnseq.faithfulness.importance``; this module holds their settings
and the statistics, torch-free (scipy is imported on first use)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import fmean
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import numpy as np

MEASURES = ("grad_x_input", "integrated_gradients", "leave_one_out")
"""The importance measures, in the order they are reported."""

Measure = Literal["grad_x_input", "integrated_gradients", "leave_one_out"]


class ImportanceSettings(BaseModel):
    """How the importance measures are computed (docs/evaluation.md, "Attention and other measures of
    importance")."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    measures: tuple[Measure, ...] = Field(MEASURES, min_length=1, strict=False, description="the measures to "
                                          "compute (a list from a config file), of "
                                          f"{', '.join(MEASURES)}")
    ig_steps: int = Field(50, ge=1, le=1000, description="integrated gradients: the points of the path integral "
                          "from the baseline to the source embeddings (Gauss-Legendre, captum's default method)")
    ig_baseline: Literal["zero", "pad"] = Field("zero", description="integrated gradients: where the path starts; "
                                                "zero = the zero vector at every source position, pad = the "
                                                "padding token's embedding row there")
    batch_size: int = Field(256, ge=1, le=2**16, description="rows per forward pass: decoder steps for the "
                            "gradients, IG's interpolation points, shortened sources for leave-one-out")
    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="a step's τ is significant when its p-value is below "
                         "alpha")


@dataclass(frozen=True)
class Agreement:
    """One ranking against another over the n real source positions: Kendall's τ-b, its two-sided p-value
    (scipy's, exact for small n without ties), and ``top1`` (1.0 when both put the same position first, else
    0.0). All three are NaN when either ranking is constant (uniform attention, an importance that is zero
    everywhere): a constant has no order and no top position."""

    tau: float
    p_value: float
    top1: float


def agreement(attention: np.ndarray, importance: np.ndarray) -> Agreement:
    """``attention`` and ``importance``: ``(n,)`` each, over the same real source positions."""
    import numpy as np
    from scipy.stats import kendalltau

    attention, importance = np.asarray(attention, dtype=float), np.asarray(importance, dtype=float)
    if attention.shape != importance.shape or attention.ndim != 1:
        raise ValueError(f"agreement needs two (n,) rankings, got {attention.shape} and {importance.shape}")
    if np.ptp(attention) == 0 or np.ptp(importance) == 0:
        return Agreement(math.nan, math.nan, math.nan)
    result = kendalltau(attention, importance)
    top1 = float(np.argmax(attention) == np.argmax(importance))
    return Agreement(float(result.statistic), float(result.pvalue), top1)


@dataclass(frozen=True)
class StepAgreement:
    """A step's attention against one measure: the mean over heads' weights, and each head's own."""

    mean: Agreement
    heads: tuple[Agreement, ...]


def step_agreement(attention: np.ndarray, importance: np.ndarray) -> StepAgreement:
    """``attention`` ``(H, n)``, each head's weights over the n real positions; ``importance`` ``(n,)``."""
    return StepAgreement(agreement(attention.mean(0), importance),  # (n,): the mean over heads
                         tuple(agreement(head, importance) for head in attention))


def summarize(agreements: Iterable[dict[str, StepAgreement]], alpha: float = 0.05) -> dict[str, float]:
    """Over many steps (each a measure → ``StepAgreement``), per measure: the mean τ (``<measure>/tau``), the
    share of steps whose τ is significant at ``alpha`` (``<measure>/significant``, J&W's count) and the
    top-1 agreement rate (``<measure>/top1``), of the mean over heads; steps where τ is NaN left out."""
    found: dict[str, list[Agreement]] = {}
    for step in agreements:
        for measure, result in step.items():
            if not math.isnan(result.mean.tau):
                found.setdefault(measure, []).append(result.mean)
    summary = {}
    for measure, results in found.items():
        summary[f"{measure}/tau"] = fmean(r.tau for r in results)
        summary[f"{measure}/significant"] = fmean(r.p_value < alpha for r in results)
        summary[f"{measure}/top1"] = fmean(r.top1 for r in results)
    return summary


# -- Can a very different attention give the same output? (Jain & Wallace 2019, §4.2.2) ---------------------------
class AdversarialSettings(BaseModel):
    """J&W's adversarial attention search (``attnseq.faithfulness.adversarial``; docs/evaluation.md)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    samples: int = Field(64, ge=1, le=2**16, description="decoder steps searched, drawn at random from the batch's "
                         "real steps (all of them when fewer)")
    epsilon: float = Field(0.01, gt=0.0, le=1.0, description="the largest total variation between the output "
                           "distributions an adversarial attention may cause (J&W: 0.01)")
    iterations: int = Field(200, ge=1, le=100_000, description="Adam steps of the search at most")
    seconds: float = Field(60.0, gt=0.0, le=86_400.0, description="the search's time budget in seconds: it stops "
                           "after the iteration running when this is spent")
    lr: float = Field(0.1, gt=0.0, le=10.0, description="Adam's learning rate on the adversarial scores")
    penalty: float = Field(100.0, gt=0.0, le=1e6, description="λ of the relaxed objective JSD − λ·max(0, TV − ε)")
    seed: int = Field(0, ge=0, description="the sampled steps and the search's random start")


def jensen_shannon(p: np.ndarray, q: np.ndarray) -> float:
    """JSD(p, q) = ½ KL(p ‖ m) + ½ KL(q ‖ m), m = (p + q)/2, natural log (0 … ln 2, as J&W report it)."""
    import numpy as np

    p, q = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        inside = a > 0  # 0 · log 0 = 0; m > 0 wherever a > 0
        return float(np.sum(a[inside] * np.log(a[inside] / m[inside])))

    return 0.5 * kl(p) + 0.5 * kl(q)


def jsd_by_length(lengths: Iterable[int], jsd: Iterable[float], bounds: list[tuple[int, int]]) -> list[dict]:
    """The mean JSD reached per source-length bucket ``(lo, hi)``: rows ``lo``, ``hi``, ``steps``, ``jsd``
    (None where no step fell)."""
    pairs = list(zip(lengths, jsd))
    rows = []
    for lo, hi in bounds:
        inside = [value for n, value in pairs if lo <= n <= hi]
        rows.append({"lo": lo, "hi": hi, "steps": len(inside), "jsd": fmean(inside) if inside else None})
    return rows


# -- Faithfulness over training and per length bucket (docs/evaluation.md, "Faithfulness over training") -----------
class FaithSettings(ImportanceSettings):
    """``faith.*`` of ``conf/evaluate.yaml``: the importance measures' settings, on how many sequences they run,
    the counterfactual flip rates and the adversarial search (``faith.adversarial``; null: not searched)."""

    samples: int = Field(0, ge=0, le=100_000, description="sequences the faithfulness measures run on (validation: "
                         "the same ones each time, spread over the source lengths; evaluation: spread over the "
                         "evaluated ones); 0 = off")
    counterfactual: bool = Field(True, description="the flip rates of the uniform and the permuted attention on "
                                 "those sequences")
    adversarial: AdversarialSettings | None = Field(AdversarialSettings(), description="the adversarial search on "
                                                    "their steps; null = off")

    def groups(self) -> tuple[str, ...]:
        """What is reported: the measures, then ``counterfactual`` and ``adversarial`` when on; () when off."""
        if self.samples == 0:
            return ()
        return (*self.measures, *(("counterfactual",) if self.counterfactual else ()),
                *(("adversarial",) if self.adversarial is not None else ()))


class TrainFaithSettings(FaithSettings):
    """``faith.*`` of ``conf/train.yaml``: as evaluation's, at every ``every_n_epochs``-th validation."""

    every_n_epochs: int = Field(1, ge=1, le=10_000, description="measured at every n-th validation epoch")


def faith_names(groups: Iterable[str]) -> list[str]:
    """The names ``groups`` (``FaithSettings.groups``) report, without stage or bucket."""
    found = []
    for group in groups:
        if group == "counterfactual":
            found += [f"faith/cf_{mode}_flip_rate" for mode in ("permute", "uniform")]
        elif group == "adversarial":
            found.append("faith/adversarial_jsd")
        else:
            found += [f"faith/{group}/{key}" for key in ("tau", "significant", "top1")]
    return found


@dataclass
class FaithRecords:
    """What the faithfulness probe found on some sequences, step by step, each with its source length:
    the importance measures' agreement, the counterfactual steps and flips per mode, the adversarial JSD."""

    agreements: list[tuple[int, dict[str, StepAgreement]]]
    flips: list[tuple[str, int, int, int]]  # (mode, source length, steps, flipped steps)
    jsd: list[tuple[int, float]]

    def extend(self, other: FaithRecords) -> None:
        self.agreements += other.agreements
        self.flips += other.flips
        self.jsd += other.jsd

    def summary(self, alpha: float, lo: int = 1, hi: int = 2**31) -> dict[str, float]:
        """The steps of sources of ``lo`` … ``hi`` tokens: ``summarize`` of the agreements (``<measure>/tau``,
        ``/significant``, ``/top1``), ``cf_<mode>_flip_rate`` and ``adversarial_jsd`` (their means); a name
        with no step (or only NaN τ) is left out."""
        values = summarize((found for n, found in self.agreements if lo <= n <= hi), alpha)
        for mode in dict.fromkeys(mode for mode, *_ in self.flips):
            steps = sum(s for m, n, s, _ in self.flips if m == mode and lo <= n <= hi)
            if steps:
                values[f"cf_{mode}_flip_rate"] = sum(f for m, n, _, f in self.flips if m == mode and lo <= n <= hi) \
                    / steps
        inside = [value for n, value in self.jsd if lo <= n <= hi]
        if inside:
            values["adversarial_jsd"] = fmean(inside)
        return values
