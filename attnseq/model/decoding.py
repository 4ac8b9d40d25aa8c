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
) -> Decoded:
    """Decode a padded batch at once; stop when all sequences emitted EOS or at ``max_length``.

    Whether all are finished is read back from the device only every ``check_every`` steps.
    ``encoded``: ``model.encode(src, src_lengths)`` when the caller has it already. ``keep_attention=False``:
    no step's weights are kept (``attention`` is None), for callers that read the tokens alone.
    """
    memory, state = encoded if encoded is not None else model.encode(src, src_lengths)
    batch = src.shape[0]
    tokens = torch.full((batch,), bos_id, dtype=torch.long, device=src.device)  # (B,)
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)  # (B,)
    lengths = torch.full((batch,), max_length, dtype=torch.long, device=src.device)  # (B,)
    out_tokens: list[Tensor] = []
    out_weights: list[Tensor] = []
    for t in range(max_length):
        logits, weights, state = model.decoder.step(tokens, state, memory)  # (B, V), (B, H, T_enc)
        tokens = logits.argmax(-1).masked_fill(finished, pad_id)  # (B,)
        if weights is not None and keep_attention:
            out_weights.append(weights.masked_fill(finished[:, None, None], 0.0))
        out_tokens.append(tokens)
        just_ended = (tokens == eos_id) & ~finished  # (B,)
        lengths = torch.where(just_ended, torch.full_like(lengths, t + 1), lengths)
        finished = finished | just_ended
        if (t + 1) % check_every == 0 and bool(finished.all()):
            break
    attention = torch.stack(out_weights, dim=2) if out_weights else None  # (B, H, T_out, T_enc)
    return Decoded(torch.stack(out_tokens, dim=1), lengths, attention)  # (B, T_out)
