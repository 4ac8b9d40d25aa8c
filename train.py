"""A tiny demonstration of the model library until the training service lands.

Trains a GRU encoder–decoder with Bahdanau attention on a small copy task in a plain PyTorch
loop and prints validation exact match. No tracking, no configs: those come with training.
"""

from __future__ import annotations

import time

import torch

from attnseq.attention import lengths_to_valid_mask
from attnseq.model import ModelConfig, build_seq2seq, greedy_decode

PAD, BOS, EOS, FIRST_SYMBOL, SYMBOLS = 0, 1, 2, 4, 10


def copy_batch(batch: int, max_len: int, gen: torch.Generator):
    lengths = torch.randint(1, max_len + 1, (batch,), generator=gen)
    src = torch.randint(FIRST_SYMBOL, FIRST_SYMBOL + SYMBOLS, (batch, max_len), generator=gen)
    src = src.masked_fill(~lengths_to_valid_mask(lengths, max_len), PAD)  # (B, T)
    tgt_out = torch.cat([src, torch.zeros(batch, 1, dtype=torch.long)], 1)  # (B, T+1)
    tgt_out[torch.arange(batch), lengths] = EOS
    tgt_in = torch.cat([torch.full((batch, 1), BOS), tgt_out[:, :-1]], 1)  # (B, T+1)
    tgt_in = tgt_in.masked_fill(tgt_in == EOS, PAD)
    return src, lengths, tgt_in, tgt_out


def main() -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = build_seq2seq(ModelConfig(FIRST_SYMBOL + SYMBOLS, FIRST_SYMBOL + SYMBOLS, 32, 64))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    start = time.perf_counter()
    for step in range(1, 301):
        src, lengths, tgt_in, tgt_out = copy_batch(64, 10, gen)
        logits, _ = model(src, lengths, tgt_in)  # (B, T_dec, V)
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt_out, ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step:4d}  loss {loss.item():.3f}  ({time.perf_counter() - start:.0f}s)")
    model.eval()
    src, lengths, _, tgt_out = copy_batch(512, 10, gen)
    decoded = greedy_decode(model, src, lengths, max_length=12)
    width = min(decoded.tokens.shape[1], tgt_out.shape[1])
    real = tgt_out != PAD
    same = (decoded.tokens[:, :width] == tgt_out[:, :width]) | ~real[:, :width]
    exact = same.all(1) & (decoded.tokens.shape[1] >= lengths + 1)
    print(f"copy task, lengths 1-10, Bahdanau additive attention: exact match {exact.float().mean():.1%}")


if __name__ == "__main__":
    main()
