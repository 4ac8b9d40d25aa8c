"""Does the attention agree with other measures of importance? (Jain & Wallace 2019, §4.1): per decoder step,
Kendall's τ between the attention over the real source positions and an importance measure, its p-value, and
whether both put the same position first. The measures themselves (gradient × input, integrated gradients,
leave-one-out) are computed from a model by ``attnseq.evaluation.importance``; this module holds their settings
and the statistics, torch-free (scipy is imported on first use)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

MEASURES = ("grad_x_input", "integrated_gradients", "leave_one_out")
"""The importance measures, in the order they are reported."""

Measure = Literal["grad_x_input", "integrated_gradients", "leave_one_out"]


class ImportanceSettings(BaseModel):
    """How the importance measures are computed (docs/evaluation.md, "Attention and other measures of
    importance")."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    measures: tuple[Measure, ...] = Field(MEASURES, min_length=1, description="the measures to compute, of "
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
        summary[f"{measure}/tau"] = float(np.mean([r.tau for r in results]))
        summary[f"{measure}/significant"] = float(np.mean([r.p_value < alpha for r in results]))
        summary[f"{measure}/top1"] = float(np.mean([r.top1 for r in results]))
    return summary
