"""The evaluation loop as it was before it was batched for speed (issue 16, item 3), kept as the
yardstick: ``tests/test_evaluation_speed.py`` checks that ``evaluate_run`` reports exactly what this
reports, and ``benchmarks/evaluation_speed.py`` times the two side by side.

Per batch it encodes the source four times (decoding, the teacher-forced pass, one replay per
counterfactual mode), and each replay runs a deep copy of the whole model whose attention scores,
averages the values, then throws both away for the swapped weights. Decoding goes through
``greedy_decode``/``beam_search`` without a shared encoding and with ``decoder.step`` at each step
(``stepwise=True``), as it did.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torchmetrics.text import BLEUScore

from attnseq.attention import Attention
from attnseq.data import Example, collate, encode_examples
from attnseq.data.vocab import EOS, PAD
from attnseq.evaluation.evaluator import (
    TEXT_TASKS,
    EvalResult,
    EvalSettings,
    decoded_row,
    evaluation_examples,
    length_limit,
)
from attnseq.evaluation.trained_runs import TrainedRun
from attnseq.faithfulness.counterfactual import MODES, CounterfactualTotals, permute_weights
from attnseq.metrics import DIAGNOSTICS, AttentionDiagnostics, LengthBucketedAccuracy, bucket_name
from attnseq.metrics.length_buckets import bucket_digits
from attnseq.model import Decoded, greedy_decode
from attnseq.model.beam import beam_search
from attnseq.model.fused_decoders import step_through


def uniform_like(weights: Tensor, valid_mask: Tensor) -> Tensor:
    mask = valid_mask.view(valid_mask.shape[0], *([1] * (weights.dim() - 2)), valid_mask.shape[1]).to(weights.dtype)
    counts = mask.sum(-1, keepdim=True).clamp_min(1.0)  # (B, 1, [1,] 1)
    return (mask / counts).expand_as(weights)  # (B, H, [T_dec,] T_enc)


class ReferenceCounterfactualAttention(nn.Module):
    """Computes the real context and weights, then replaces them."""

    def __init__(self, inner: Attention, mode: str, generator: torch.Generator) -> None:
        super().__init__()
        self.inner = inner
        self.mode = mode
        self.generator = generator
        self.query_dim, self.key_dim, self.heads = inner.query_dim, inner.key_dim, inner.heads

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.inner.project_keys(keys)

    def forward(
        self, query: Tensor, keys: Tensor, valid_mask: Tensor, projected_keys: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        _, weights = self.inner(query, keys, valid_mask, projected_keys=projected_keys)  # (B, H, [T_dec,] T_enc)
        if self.mode == "permute":
            weights = permute_weights(weights, valid_mask, self.generator)
        else:
            weights = uniform_like(weights, valid_mask)
        one_step = weights.dim() == 3
        values = self.inner.split_heads(keys)  # (B, H, T_enc, d_h)
        context = (weights.unsqueeze(2) if one_step else weights) @ values  # (B, H, T_dec, d_h)
        batch, _, steps, _ = context.shape
        context = context.transpose(1, 2).reshape(batch, steps, self.key_dim)  # (B, T_dec, d_k)
        return (context.squeeze(1), weights) if one_step else (context, weights)


def reference_twin(model: nn.Module, mode: str, generator: torch.Generator) -> nn.Module:
    twin = copy.deepcopy(model)
    twin.decoder.attention = ReferenceCounterfactualAttention(twin.decoder.attention, mode, generator)
    return twin


def strip(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS)] if EOS in ids else [i for i in ids if i != PAD]


def reference_teacher_forcing(model: nn.Module, batch) -> tuple[Tensor, Tensor | None]:
    """The teacher-forced pass as it ran then: the fused recurrence where the decoder takes it, else
    ``decoder.step`` at each step (``decoder(...)`` now runs the fused decoding step outside autograd)."""
    memory, state = model.encode(batch.src, batch.src_lengths)
    decoder = model.decoder
    if decoder.takes_fast_path():
        return decoder.teacher_forced(batch.tgt_in, state, memory)  # (B, T_dec, V), (B, H, T_dec, T_enc)
    return step_through(lambda tokens, now: decoder.step(tokens, now, memory), batch.tgt_in, state)


def reference_decode(trained: TrainedRun, batch, beam_size: int) -> Decoded:
    limit = length_limit(trained, batch)
    if beam_size > 1:
        return beam_search(trained.model, batch.src, batch.src_lengths, beam_size, max_length=limit, stepwise=True)
    return greedy_decode(trained.model, batch.src, batch.src_lengths, max_length=limit, stepwise=True)


@torch.no_grad()
def reference_evaluate_run(
    trained: TrainedRun, settings: EvalSettings, examples: list[Example] | None = None
) -> EvalResult:
    """The run's metrics at ``settings``; ``predictions`` are recorded as ``evaluate_run`` records them."""
    examples = examples if examples is not None else evaluation_examples(trained, settings)
    model, width = trained.model.eval(), settings.bucket_width
    max_length = settings.lengths[1]
    accuracy = LengthBucketedAccuracy(max_length, width)
    diagnostics = AttentionDiagnostics(max_length, width)
    train_lo, train_hi = trained.train_lengths
    accuracy_inside = LengthBucketedAccuracy(train_hi, train_hi)
    diagnostics_inside = AttentionDiagnostics(train_hi, train_hi)
    is_text = trained.config["dataset"]["task"] in TEXT_TASKS
    bleu = BLEUScore(n_gram=4) if is_text else None
    with_attention = model.attention is not None
    generator = torch.Generator().manual_seed(settings.seed)
    twins = (
        {mode: reference_twin(model, mode, generator) for mode in MODES}
        if settings.counterfactual and with_attention
        else {}
    )
    totals = {mode: CounterfactualTotals.empty(max_length, width) for mode in twins}
    decoded_in_order: list[list[int]] = []

    ordered = sorted(examples, key=lambda e: len(e.src))
    encoded = encode_examples(ordered, trained.src_vocab, trained.tgt_vocab)
    for start in range(0, len(encoded), settings.batch_size):
        batch = collate(encoded[start : start + settings.batch_size])
        decoded = reference_decode(trained, batch, settings.beam_size)
        decoded_in_order += [row[:n] for row, n in zip(decoded.tokens.tolist(), decoded.lengths.tolist())]
        accuracy.update(decoded.tokens, batch.tgt_out, batch.tgt_lengths, batch.src_lengths)
        seen = (batch.src_lengths >= train_lo) & (batch.src_lengths <= train_hi)  # (B,)
        accuracy_inside.update(
            decoded.tokens[seen], batch.tgt_out[seen], batch.tgt_lengths[seen], batch.src_lengths[seen]
        )
        logits, attention = reference_teacher_forcing(model, batch)
        if attention is not None:
            diagnostics.update(attention, batch.alignment, batch.tgt_lengths, batch.src_lengths)
            diagnostics_inside.update(
                attention[seen], batch.alignment[seen], batch.tgt_lengths[seen], batch.src_lengths[seen]
            )
        for mode, twin in twins.items():
            changed, _ = twin(batch.src, batch.src_lengths, batch.tgt_in)
            totals[mode].update(logits, changed, batch.tgt_lengths, batch.src_lengths, width)
        if bleu is not None:
            hyps = [" ".join(trained.tgt_vocab.decode(strip(row))) for row in decoded.tokens.tolist()]
            refs = [[" ".join(ex.tgt)] for ex in ordered[start : start + settings.batch_size]]
            bleu.update(hyps, refs)

    metrics = {f"eval/{k}": float(v) for k, v in accuracy.compute().items()}
    inside = accuracy_inside.compute() if int(accuracy_inside.sequences.sum()) else {}
    metrics.update({f"eval/{k}_train_lengths": float(inside[k]) for k in ("acc", "exact_match") if k in inside})
    rows = accuracy.bucket_table()
    if with_attention:
        metrics.update({f"eval/{k}": float(v) for k, v in diagnostics.compute().items()})
        if int(diagnostics_inside.steps.sum()):
            metrics.update({f"eval/{k}_train_lengths": float(v) for k, v in diagnostics_inside.compute().items()})
        for row, diagnosed in zip(rows, diagnostics.bucket_table()):
            row.update({name: diagnosed[name] for name in DIAGNOSTICS})
            metrics.update({f"eval/{name}_len/{row['bucket']}": diagnosed[name] for name in DIAGNOSTICS
                            if diagnosed[name] is not None})
    if bleu is not None:
        metrics["eval/bleu"] = float(bleu.compute())
    digits = bucket_digits(max_length)
    for mode, total in totals.items():
        for key, value in total.summary().items():
            metrics[f"eval/cf_{mode}_{key}"] = value
        for row, cf in zip(rows, total.rows()):
            row[f"cf_{mode}_flip_rate"], row[f"cf_{mode}_tv"] = cf["flip_rate"], cf["tv"]
            if cf["flip_rate"] is not None:
                name = bucket_name(cf["lo"], cf["hi"], digits)
                metrics[f"eval/cf_{mode}_flip_len/{name}"] = cf["flip_rate"]
    samples = []
    if model.attention is not None and ordered:
        picked = ordered[-3:]
        batch = collate(encode_examples(picked, trained.src_vocab, trained.tgt_vocab))
        decoded = reference_decode(trained, batch, settings.beam_size)
        samples = [(example, decoded_row(decoded, i)) for i, example in enumerate(picked)]
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].src))
    predictions: list[list[int]] = [[] for _ in examples]
    for i, row in zip(order, decoded_in_order):
        predictions[i] = row
    return EvalResult(metrics, rows, totals, long_samples=samples, predictions=predictions)
