"""The faithfulness probe on a sample of sequences, for validation (``val/faith/...``, each time on the same
ones) and evaluation (``eval/faith/...``, per length bucket): the importance measures' agreement with the
attention (``attnseq.faithfulness.importance``), the flip rates of the uniform and the permuted attention
(``attnseq.faithfulness.counterfactual``) and the adversarial JSD (``attnseq.faithfulness.adversarial``), as
``FaithRecords`` the metrics suite summarises (``MetricSuite.update_faithfulness``). Teacher-forced with the
gold prefix. It runs with gradients (integrated gradients, the search) even inside Lightning's or the
evaluator's inference mode: the inputs are copied out of it first."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnseq.faithfulness.adversarial import adversarial_attention
from attnseq.faithfulness.counterfactual import MODES, CounterfactualReplay
from attnseq.faithfulness.importance import evaluating, step_importance
from attnseq.metrics.faithfulness import FaithRecords, FaithSettings

__all__ = ["probe", "spread"]


def spread(lengths: Sequence[int], samples: int) -> list[int]:
    """``samples`` indices of ``lengths`` (all when fewer), evenly spaced in the order of length: short to long."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if samples >= len(order):
        return sorted(order)
    return sorted({order[round(k * (len(order) - 1) / max(samples - 1, 1))] for k in range(samples)})


def probe(model: nn.Module, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_lengths: Tensor,
          settings: FaithSettings) -> FaithRecords:
    """The records of every sequence of the batch (``settings.samples`` is the caller's to apply). ``model`` must
    have an attention; it is run in eval mode and put back as it was."""
    with torch.inference_mode(False), torch.enable_grad():
        device = next(model.parameters()).device
        src, src_lengths, tgt_in, tgt_lengths = (t.clone().to(device) for t in (src, src_lengths, tgt_in, tgt_lengths))
        records = FaithRecords([], [], [])
        lengths = src_lengths.tolist()
        if settings.measures:
            records.agreements = [(lengths[step.row], step.agreement())
                                  for step in step_importance(model, src, src_lengths, tgt_in, tgt_lengths, settings)]
        if settings.counterfactual:
            records.flips = _flips(model, src, src_lengths, tgt_in, tgt_lengths)
        if settings.adversarial is not None:
            found = adversarial_attention(model, src, src_lengths, tgt_in, tgt_lengths, settings.adversarial)
            records.jsd = [(step.length, step.jsd) for step in found]
    return records


def _flips(model: nn.Module, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
           tgt_lengths: Tensor) -> list[tuple[str, int, int, int]]:
    """Per mode and sequence: its source length, its real target steps and how many of their argmax tokens
    the replaced attention flips (the replays of ``attnseq.faithfulness.counterfactual``, seed 0)."""
    found = []
    with evaluating(model), torch.no_grad():
        memory, state = model.encode(src, src_lengths)
        logits, _ = model.decoder(tgt_in, state, memory)  # (B, T_dec, V)
        valid = torch.arange(tgt_in.shape[1], device=src.device).unsqueeze(0) < tgt_lengths.unsqueeze(1)  # (B, T_dec)
        generator = torch.Generator(device=src.device).manual_seed(0)  # permute draws on the model's device
        for mode in MODES:
            replayed = CounterfactualReplay(model.decoder, mode, generator)(tgt_in, state, memory)  # (B, T_dec, V)
            flips = ((logits.argmax(-1) != replayed.argmax(-1)) & valid).sum(-1)  # (B,)
            found += [(mode, n, s, f) for n, s, f in zip(src_lengths.tolist(), valid.sum(-1).tolist(), flips.tolist())]
    return found
