"""Batched greedy decoding: every sequence steps together and stops at its own EOS."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnseq.data.vocab import BOS, EOS, PAD
from attnseq.model.seq2seq import Seq2Seq
from attnseq.model.state import DecoderState, Memory

Encoded = tuple[Memory, DecoderState]
"""``model.encode(src, src_lengths)``'s result, for callers that decode one batch several ways."""


def decode_length_limit(src_lengths: Tensor, ratio: float, extra: int) -> int:
    """How many tokens decoding (greedy or beam) may emit for a batch: ``ratio × longest source +
    extra`` (the run's ``decode.max_length_ratio`` and ``decode.max_length_extra``), in training's
    validation, its heatmaps and evaluation alike."""
    return int(int(src_lengths.max()) * ratio) + int(extra)


class Decoded(NamedTuple):
    tokens: Tensor  # (B, T_out): the output up to and including EOS, then PAD
    lengths: Tensor  # (B,): tokens up to and including EOS (T_out where no EOS came)
    attention: Tensor | None  # (B, H, T_out, T_enc); zeros after a sequence's EOS


@torch.no_grad()
def greedy_decode(
    model: Seq2Seq,
    src: Tensor,
    src_lengths: Tensor,
    max_length: int,
    bos_id: int = BOS,
    eos_id: int = EOS,
    pad_id: int = PAD,
    check_every: int = 4,
    encoded: Encoded | None = None,
    keep_attention: bool = True,
    stepwise: bool = False,
) -> Decoded:
    """Decode a padded batch at once; stop when all sequences emitted EOS or at ``max_length``.

    Whether all are finished is read back from the device only every ``check_every`` steps.
    ``encoded``: ``model.encode(src, src_lengths)`` when the caller has it already. ``keep_attention=False``:
    no step's weights are kept (``attention`` is None), for callers that read the tokens alone. Each step is
    the decoder's ``decoding_step`` (its fused step where it has one: the same tokens as ``decoder.step``);
    ``stepwise=True``: ``decoder.step`` itself, as decoding ran before the fused step. The tokens and the
    weights are written into buffers of ``max_length`` steps, cut to the steps run.
    """
    memory, state = encoded if encoded is not None else model.encode(src, src_lengths)
    step = model.decoder.decoding_step(memory, stepwise=stepwise)
    batch, device = src.shape[0], src.device
    tokens = torch.full((batch,), bos_id, dtype=torch.long, device=device)  # (B,)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
    lengths = torch.full((batch,), max_length, dtype=torch.long, device=device)  # (B,)
    out_tokens = torch.full((batch, max_length), pad_id, dtype=torch.long, device=device)  # (B, max_length)
    out_weights: Tensor | None = None  # (B, H, max_length, T_enc), made at the first step's weights
    steps = 0
    for t in range(max_length):
        logits, weights, state = step(tokens, state)  # (B, V), (B, H, T_enc)
        tokens = logits.argmax(-1).masked_fill_(finished, pad_id)  # (B,)
        out_tokens[:, t] = tokens
        if weights is not None and keep_attention:
            if out_weights is None:
                out_weights = weights.new_zeros(batch, weights.shape[1], max_length, weights.shape[2])
            out_weights[:, :, t] = weights
        just_ended = (tokens == eos_id) & ~finished  # (B,)
        lengths.masked_fill_(just_ended, t + 1)
        finished |= just_ended
        steps = t + 1
        if steps % check_every == 0 and bool(finished.all()):
            break
    attention = None
    if out_weights is not None:
        attention = out_weights[:, :, :steps]  # (B, H, T_out, T_enc)
        after_end = torch.arange(steps, device=device)[None, :] >= lengths[:, None]  # (B, T_out): past EOS
        attention.masked_fill_(after_end[:, None, :, None], 0.0)  # zeros after a sequence's EOS
    return Decoded(out_tokens[:, :steps], lengths, attention)  # (B, T_out)
