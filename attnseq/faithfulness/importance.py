"""Other measures of importance, per decoder step, to hold the attention against (Jain & Wallace 2019, §4.1).

For each target step t of a teacher-forced batch, with ŷ_t = argmax p(· | x, y_<t) the predicted token and
f(x) = p(ŷ_t | x, y_<t) its probability (softmax of the logits), over the n real source positions i:

- ``grad_x_input``: |Σ_e (∂f/∂x_{i,e}) · x_{i,e}|, x_i the source token's embedding (the encoder's
  ``nn.Embedding`` output, before any scaling or positions), gradient through the whole model, the attention
  included (captum's ``InputXGradient``);
- ``integrated_gradients``: |Σ_e IG_{i,e}|, IG from a baseline x' to x over ``ig_steps`` points
  (Gauss-Legendre, captum's ``IntegratedGradients``); the baseline (``ig_baseline``) is the zero vector at every
  source position, or the padding token's embedding row (``pad``); Σ_i Σ_e IG_{i,e} = f(x) − f(x');
- ``leave_one_out``: the total variation ½ Σ_v |p(v | x, y_<t) − p(v | x∖i, y_<t)| between the output
  distribution of step t and that of the same step with token i **deleted** from the source: the encoder reads
  the other n − 1 tokens in order and the attention spans their n − 1 states (so x_i is masked out of both),
  the decoder inputs y_<t unchanged.

``step_importance`` returns the steps with these and each head's attention weights; ``StepImportance.agreement``
holds them against each other (Kendall τ, p-value, top-1: ``attnseq.metrics.faithfulness``). A source of one
token has no ranking to compare: its steps are left out. The settings: ``ImportanceSettings``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from attnseq.attention import lengths_to_valid_mask
from attnseq.metrics.faithfulness import MEASURES, ImportanceSettings, StepAgreement, step_agreement

DEFAULTS = ImportanceSettings()
"""50 Gauss-Legendre points from the zero baseline, every measure."""

__all__ = ["DEFAULTS", "MEASURES", "ImportanceSettings", "StepImportance", "gradient_importance", "leave_one_out",
           "step_importance"]


@dataclass(frozen=True)
class StepImportance:
    """Decoder step ``step`` of batch row ``row``: its predicted token, each head's attention ``(H, n)`` over the
    n real source positions, and each computed measure's importance ``(n,)`` of the same positions."""

    row: int
    step: int
    token: int
    attention: np.ndarray
    measures: dict[str, np.ndarray]

    def agreement(self) -> dict[str, StepAgreement]:
        """Per measure: Kendall τ, p-value and top-1 agreement with the mean over heads, and with each head."""
        return {name: step_agreement(self.attention, values) for name, values in self.measures.items()}


@contextmanager
def _embeddings_replaced(embedding: nn.Module, embedded: Tensor) -> Iterator[None]:
    """Within the block, ``embedding`` returns ``embedded`` ``(N, T_enc, E)`` whatever its tokens."""
    handle = embedding.register_forward_hook(lambda _module, _inputs, _output: embedded)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Within the block, ``model`` is in eval mode; afterwards as it was."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


def _predicted_probabilities(model: nn.Module, embedded: Tensor, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                             steps: Tensor) -> Tensor:
    """Row r's output distribution at its step ``steps[r]`` with the source embeddings ``embedded``: ``(N, V)``."""
    with _embeddings_replaced(model.encoder.embedding, embedded):
        logits, _ = model(src, src_lengths, tgt_in)  # (N, T_dec, V)
    rows = torch.arange(logits.shape[0], device=logits.device)  # (N,)
    return logits[rows, steps].softmax(-1)  # (N, V)


def _baseline(model: nn.Module, embedded: Tensor, kind: str) -> Tensor:
    if kind == "zero":
        return torch.zeros_like(embedded)  # (N, T_enc, E)
    embedding = model.encoder.embedding
    pad = embedding.weight[embedding.padding_idx or 0].detach()  # (E,)
    return pad.expand_as(embedded).contiguous()  # (N, T_enc, E)


def gradient_importance(model: nn.Module, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, rows: Tensor,
                        steps: Tensor, tokens: Tensor, measure: str,
                        settings: ImportanceSettings = DEFAULTS) -> Tensor:
    """``grad_x_input`` or ``integrated_gradients`` of p(``tokens[r]``) at step ``steps[r]`` of batch row
    ``rows[r]``, per source position: ``(N, T_enc)`` (0 at padding). ``model`` in eval mode."""
    from captum.attr import InputXGradient, IntegratedGradients

    def forward(embedded: Tensor, *args: Tensor) -> Tensor:
        return _predicted_probabilities(model, embedded, *args)  # (N', V)

    found: Tensor | None = None  # (N, T_enc), in the attributions' dtype
    chunks = [chunk for step in steps.unique() for chunk in (steps == step).nonzero(as_tuple=True)[0].split(
        settings.batch_size)]  # rows of one step together: step t's output reads only the decoder inputs up to t
    for chunk in chunks:
        picked, step = rows[chunk], int(steps[chunk[0]])  # (N',)
        with torch.no_grad():
            embedded = model.encoder.embedding(src[picked]).requires_grad_()  # (N', T_enc, E): a leaf
        args = (src[picked], src_lengths[picked], tgt_in[picked, :step + 1], steps[chunk])  # (N', t + 1) inputs
        if measure == "grad_x_input":
            attributions = InputXGradient(forward).attribute(embedded, target=tokens[chunk],
                                                             additional_forward_args=args)  # (N', T_enc, E)
        elif measure == "integrated_gradients":
            attributions = IntegratedGradients(forward).attribute(
                embedded, baselines=_baseline(model, embedded, settings.ig_baseline), target=tokens[chunk],
                additional_forward_args=args, n_steps=settings.ig_steps, internal_batch_size=settings.batch_size,
            )  # (N', T_enc, E)
        else:
            raise ValueError(f"gradient_importance: measure {measure!r} is not grad_x_input or integrated_gradients")
        valid = lengths_to_valid_mask(src_lengths[picked], src.shape[1])  # (N', T_enc)
        values = attributions.sum(-1).abs().detach() * valid  # (N', T_enc)
        found = values.new_zeros(len(rows), src.shape[1]) if found is None else found  # (N, T_enc)
        found[chunk] = values
    return found if found is not None else src.new_zeros(0, src.shape[1], dtype=torch.float)  # (N, T_enc)


def leave_one_out(model: nn.Module, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                  settings: ImportanceSettings = DEFAULTS) -> Tensor:
    """``(B, T_dec, T_enc)``: at [b, t, i] the total variation between step t's output distribution and the
    same step's with source token i deleted (module docstring); NaN at padded i and for sources of one token
    (deleting it would leave none). ``model`` in eval mode."""
    batch, length = src.shape
    with torch.no_grad():
        logits, _ = model(src, src_lengths, tgt_in)  # (B, T_dec, V)
        original = logits.softmax(-1)  # (B, T_dec, V)
        deletable = lengths_to_valid_mask(src_lengths, length) & (src_lengths >= 2).unsqueeze(1)  # (B, T_enc)
        rows, deleted = deletable.nonzero(as_tuple=True)  # (M,), (M,): one shortened source per real token
        out = original.new_full((batch, tgt_in.shape[1], length), float("nan"))  # (B, T_dec, T_enc)
        positions = torch.arange(length, device=src.device)  # (T_enc,)
        for chunk in torch.arange(len(rows), device=src.device).split(settings.batch_size):
            picked, gone = rows[chunk], deleted[chunk]  # (M',), (M',)
            keep = positions.unsqueeze(0) != gone.unsqueeze(1)  # (M', T_enc): every position but the deleted one
            shortened = src[picked][keep].view(len(chunk), length - 1)  # (M', T_enc − 1), padding still last
            changed, _ = model(shortened, src_lengths[picked] - 1, tgt_in[picked])  # (M', T_dec, V)
            tv = 0.5 * (original[picked] - changed.softmax(-1)).abs().sum(-1)  # (M', T_dec)
            out[picked, :, gone] = tv
    return out


def ranked_steps(src_lengths: Tensor, tgt_lengths: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """The batch rows and steps ``(N,)``, ``(N,)`` of every real target step (t < ``tgt_lengths[b]``, t <
    ``steps``) whose source has ≥ 2 tokens: one token has no order to rank, nor another distribution over it."""
    positions = torch.arange(steps, device=tgt_lengths.device)  # (T_dec,)
    wanted = (positions.unsqueeze(0) < tgt_lengths.unsqueeze(1)) & (src_lengths >= 2).unsqueeze(1)  # (B, T_dec)
    return wanted.nonzero(as_tuple=True)  # (N,), (N,)


def step_importance(model: nn.Module, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_lengths: Tensor,
                    settings: ImportanceSettings = DEFAULTS) -> list[StepImportance]:
    """Every real target step (t < ``tgt_lengths[b]``) of every row whose source has ≥ 2 tokens, teacher-forced
    with ``tgt_in`` ``(B, T_dec)`` (the gold prefix, or the model's own output through ``decoder_inputs``): the
    attention the model returns and ``settings.measures`` for its predicted token. The model is run in eval mode
    (and put back as it was)."""
    with evaluating(model):
        with torch.no_grad():
            logits, weights = model(src, src_lengths, tgt_in)  # (B, T_dec, V), (B, H, T_dec, T_enc)
        if weights is None:
            raise ValueError("step_importance: the model has no attention (scorer=none) to compare")
        rows, at = ranked_steps(src_lengths, tgt_lengths, tgt_in.shape[1])  # (N,), (N,)
        tokens = logits.argmax(-1)[rows, at]  # (N,): ŷ_t
        measures = {}
        for measure in settings.measures:
            if measure == "leave_one_out":
                measures[measure] = leave_one_out(model, src, src_lengths, tgt_in, settings)[rows, at]  # (N, T_enc)
            else:
                measures[measure] = gradient_importance(model, src, src_lengths, tgt_in, rows, at, tokens, measure,
                                                        settings)  # (N, T_enc)
    found = []
    for k, (row, step) in enumerate(zip(rows.tolist(), at.tolist())):
        n = int(src_lengths[row])
        found.append(StepImportance(
            row, step, int(tokens[k]), weights[row, :, step, :n].double().cpu().numpy(),  # (H, n)
            {name: values[k, :n].double().cpu().numpy() for name, values in measures.items()},  # (n,) each
        ))
    return found
