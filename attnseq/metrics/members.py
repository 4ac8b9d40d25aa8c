"""What a member of the metrics suite is: the base class every registered metric that computes
itself subclasses (``SuiteMetric``), and what it reads per batch (``BatchOutputs``). The built-in
members are in ``attnseq.metrics.families``; ``attnseq.metrics.suite`` holds them together."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from torch import Tensor, nn

from attnseq.metrics.declarations import MetricDeclaration, SuiteSpec

__all__ = ["BatchOutputs", "SuiteMetric"]


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


class SuiteMetric(MetricDeclaration, nn.Module):
    """A registered metric (or family) that computes itself: ``update`` per batch, ``compute`` per
    epoch or evaluation. Its names and capabilities are declared as on ``MetricDeclaration``.

    ``compute()`` returns the values by name without the stage prefix; a name with nothing to
    average is left out. States are torchmetrics ``Metric``s (summed across processes) or reset
    by ``reset``.
    """

    def __init__(self, spec: SuiteSpec) -> None:
        super().__init__()
        self.spec = spec

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
