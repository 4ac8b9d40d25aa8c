"""What the attention explorer shows (``attnseq.tracking.explorer`` draws it): for a few examples, decoded
greedily, each decoder step's cross-attention (every head), the importance of the same step's source tokens
for its predicted token (``attnseq.faithfulness.importance``: gradient × input, integrated gradients,
leave-one-out) with each measure's Kendall τ against the attention (mean over heads), the gold alignment
where the task has one, and a Transformer's self-attention (per stack and layer). Plain JSON-able values.

The attention and the importance are read teacher-forced with the model's own greedy output
(``decoder_inputs``): the steps the model took when it produced that output, so both are of the same step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from attnseq.data import Example, collate, encode_examples
from attnseq.data.vocab import EOS, Vocabulary
from attnseq.faithfulness.importance import evaluating, step_importance
from attnseq.metrics.faithfulness import ImportanceSettings
from attnseq.model import decoder_inputs, greedy_decode

__all__ = ["DIGITS", "explorer_samples", "reference_attention"]

DIGITS = 4
"""Decimals kept of every weight and importance: the artifact stays small, the tooltip reads 0.1234."""


def _rounded(values: np.ndarray) -> list:
    """``values`` as nested lists, rounded to ``DIGITS``; NaN as None (JSON has no NaN)."""
    out = np.round(np.asarray(values, dtype=np.float64), DIGITS).tolist()

    def clean(item):
        if isinstance(item, list):
            return [clean(x) for x in item]
        return None if item is None or not math.isfinite(item) else item

    return clean(out)


def explorer_samples(model: nn.Module, examples: Sequence[Example], src_vocab: Vocabulary, tgt_vocab: Vocabulary,
                     max_length: int, settings: ImportanceSettings, labels: Sequence[str] | None = None,
                     measures: bool = True) -> list[dict]:
    """One entry per example: ``label``, ``source`` (tokens), ``output`` (the greedy output's tokens, EOS
    included), ``reference``, ``correct``, ``gold`` (per output step the gold source position, -1 none; None
    without a gold alignment), ``heads`` (labels), ``attention`` ``(H, T_out, T_src)``, ``importance`` (per
    measure ``(T_out, T_src)``, None at a step with none: a one-token source), ``tau`` (per measure, per step:
    Kendall τ of the mean over heads against it, None where undefined) and ``self_attention`` (per stack, per
    layer ``(H, n, n)``). ``measures=False``: the attention alone (no importance, no self-attention).
    ``model`` is run in eval mode and put back as it was; decoding emits at most ``max_length`` tokens."""
    if not examples:
        return []
    labels = list(labels) if labels is not None else [f"sample {i}" for i in range(len(examples))]
    device = next(model.parameters()).device
    with torch.inference_mode(False), torch.enable_grad(), evaluating(model):
        batch = collate(encode_examples(list(examples), src_vocab, tgt_vocab)).to(device)
        with torch.no_grad():
            decoded = greedy_decode(model, batch.src, batch.src_lengths, max_length=max_length)
            tgt_in = decoder_inputs(decoded.tokens)  # (B, T_out)
            _, weights = model(batch.src, batch.src_lengths, tgt_in)  # (B, H, T_out, T_src)
        if weights is None:
            raise ValueError("explorer_samples: the model has no attention (scorer=none) to show")
        steps = step_importance(model, batch.src, batch.src_lengths, tgt_in, decoded.lengths, settings) \
            if measures else []
        with torch.no_grad():
            maps = model.self_attention(batch.src, batch.src_lengths, tgt_in) if measures else None
    by_step = {(s.row, s.step): s for s in steps}
    agreements = {key: step.agreement() for key, step in by_step.items()}
    heads = model.decoder.head_labels(weights.shape[1])
    found = []
    for row, (label, example) in enumerate(zip(labels, examples)):
        n_src, n_out = len(example.src), int(decoded.lengths[row])
        out_ids = decoded.tokens[row, :n_out].tolist()
        entry = {
            "label": label, "source": list(example.src), "output": tgt_vocab.decode(out_ids),
            "reference": list(example.tgt),
            "correct": out_ids[:-1] == tgt_vocab.encode(example.tgt) and out_ids[-1:] == [EOS],
            "gold": None if example.alignment is None else
            [example.alignment[t] if t < len(example.alignment) else -1 for t in range(n_out)],
            "heads": heads,
            "attention": _rounded(weights[row, :, :n_out, :n_src].double().cpu().numpy()),  # (H, T_out, T_src)
            "importance": {}, "tau": {}, "self_attention": {},
        }
        if measures:
            for name in settings.measures:
                rows, taus = [], []
                for t in range(n_out):
                    step = by_step.get((row, t))
                    rows.append(None if step is None else _rounded(step.measures[name]))  # (T_src,)
                    taus.append(None if step is None else _rounded(agreements[row, t][name].mean.tau))
                entry["importance"][name], entry["tau"][name] = rows, taus
            entry["self_attention"] = {stack: [_rounded(layer) for layer in layers]  # (H, n, n) each
                                       for stack, layers in maps.of_row(row, n_src, n_out).items()}
        found.append(entry)
    return found


def reference_attention(model: nn.Module, examples: Sequence[Example], src_vocab: Vocabulary,
                        tgt_vocab: Vocabulary) -> list[np.ndarray]:
    """Each example's cross-attention mean over heads ``(T_ref + 1, T_src)``, teacher-forced with its
    reference (BOS, then the reference; the last row the step that should emit EOS): the same steps for
    every model, so two models' rows can be subtracted (a comparison's explorer). Rounded to ``DIGITS``."""
    device = next(model.parameters()).device
    with torch.inference_mode(False), torch.no_grad(), evaluating(model):
        batch = collate(encode_examples(list(examples), src_vocab, tgt_vocab)).to(device)
        _, weights = model(batch.src, batch.src_lengths, batch.tgt_in)  # (B, H, T_ref + 1, T_src)
    if weights is None:
        raise ValueError("reference_attention: the model has no attention (scorer=none) to show")
    return [np.round(weights[row, :, : len(e.tgt) + 1, : len(e.src)].double().mean(0).cpu().numpy(), DIGITS)
            for row, e in enumerate(examples)]  # (T_ref + 1, T_src) each
