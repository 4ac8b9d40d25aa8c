"""The Transformer's reference: a plain PyTorch ``nn.Transformer`` model as a tutorial writes it,
trained in lock step with attnseq's ``encoder=transformer decoder=transformer`` on the same batches,
and decoded greedily the textbook way (the whole prefix recomputed at every step) beside attnseq's
key/value-cache decoding.

``TextbookTransformer`` is attnseq's model as ``nn.Transformer`` computes it: the source and target
embeddings scaled by √E plus a precomputed sinusoidal table, a learned map E → d where they differ,
``nn.Transformer(norm_first=True)`` (its final encoder and decoder norms are attnseq's final norms)
and a linear output layer. ``copy_from`` gives it attnseq's weights, so that both models start from
the same point and compute the same function; what differs by design is ``parameters_by_design``.
"""

from __future__ import annotations

import math
import time

import torch
from loops import sync
from torch import Tensor, nn

from attnseq.data.vocab import BOS, EOS, PAD
from attnseq.model import beam_search, greedy_decode
from attnseq.model.decoding import decode_length_limit

REFERENCE = "nn.Transformer"
MAX_POSITIONS = 1024


def sinusoid_table(length: int, dim: int) -> Tensor:
    """The textbook's precomputed PE table ``(length, dim)``: sin at even features, cos at odd ones."""
    position = torch.arange(length, dtype=torch.float32)[:, None]  # (L, 1)
    rate = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))  # (dim/2,)
    table = torch.zeros(length, dim)  # (L, dim)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)[:, : dim // 2]
    return table


class TextbookTransformer(nn.Module):
    """Embeddings + positions → ``nn.Transformer(norm_first=True, batch_first=True)`` → ``nn.Linear``."""

    def __init__(self, src_vocab: int, tgt_vocab: int, emb: int, d: int, heads: int, ff: int,
                 encoder_layers: int, decoder_layers: int, dropout: float) -> None:
        super().__init__()
        self.scale = math.sqrt(emb)
        self.src_embedding = nn.Embedding(src_vocab, emb, padding_idx=PAD)
        self.tgt_embedding = nn.Embedding(tgt_vocab, emb, padding_idx=PAD)
        self.src_map = nn.Linear(emb, d) if emb != d else nn.Identity()
        self.tgt_map = nn.Linear(emb, d) if emb != d else nn.Identity()
        self.register_buffer("positions", sinusoid_table(MAX_POSITIONS, emb), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(d, heads, encoder_layers, decoder_layers, ff, dropout,
                                          batch_first=True, norm_first=True)
        self.output = nn.Linear(d, tgt_vocab)

    def embed(self, embedding: nn.Embedding, project: nn.Module, tokens: Tensor) -> Tensor:
        x = embedding(tokens) * self.scale + self.positions[: tokens.shape[1]]  # (B, T, E)
        return project(self.dropout(x))  # (B, T, d)

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The memory ``(B, T_enc, d)`` and torch's padding mask (True at padding) ``(B, T_enc)``."""
        padding = torch.arange(src.shape[1], device=src.device)[None, :] >= src_lengths[:, None]  # (B, T_enc)
        src_in = self.embed(self.src_embedding, self.src_map, src)  # (B, T_enc, d)
        return self.transformer.encoder(src_in, src_key_padding_mask=padding), padding

    def decode(self, tgt: Tensor, memory: Tensor, padding: Tensor) -> Tensor:
        steps = tgt.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(steps, device=tgt.device)  # (T, T)
        states = self.transformer.decoder(self.embed(self.tgt_embedding, self.tgt_map, tgt), memory,
                                          tgt_mask=causal, tgt_is_causal=True,
                                          memory_key_padding_mask=padding)  # (B, T, d)
        return self.output(states)  # (B, T, V)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> tuple[Tensor, None]:
        memory, padding = self.encode(src, src_lengths)
        return self.decode(tgt_in, memory, padding), None  # (B, T_dec, V)

    @torch.no_grad()
    def greedy(self, src: Tensor, src_lengths: Tensor, max_length: int) -> Tensor:
        """Greedy decoding as tutorials write it: the decoder reruns the whole prefix at every step.
        ``(B, T_out)`` tokens, PAD after each sequence's EOS."""
        memory, padding = self.encode(src, src_lengths)
        prefix = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)  # (B, 1)
        finished = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)  # (B,)
        for _ in range(max_length):
            token = self.decode(prefix, memory, padding)[:, -1].argmax(-1).masked_fill(finished, PAD)  # (B,)
            prefix = torch.cat([prefix, token[:, None]], dim=1)  # (B, t + 1)
            finished = finished | (token == EOS)
            if bool(finished.all()):
                break
        return prefix[:, 1:]  # (B, T_out)


def textbook_transformer(model: nn.Module, src_vocab: int, tgt_vocab: int, dropout: float) -> TextbookTransformer:
    """The reference sized as attnseq's ``model`` (encoder=transformer, decoder=transformer), with its weights."""
    encoder, decoder = model.encoder, model.decoder
    first = decoder.layers[0]
    reference = TextbookTransformer(
        src_vocab, tgt_vocab, encoder.embedding.embedding_dim, decoder.hidden_size, first.self_attention.heads,
        first.feed_forward[0].out_features, len(encoder.layers), len(decoder.layers), dropout,
    )
    copy_from(reference, model)
    return reference


def copy_attention(theirs: nn.MultiheadAttention, ours: nn.Module) -> None:
    """attnseq's ``MultiheadAttention`` (W_K without a bias) into torch's (its key bias zero: a constant
    added to every score of a query, which the softmax drops)."""
    theirs.in_proj_weight.copy_(torch.cat([ours.W_Q.weight, ours.W_K.weight, ours.W_V.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.W_Q.bias, torch.zeros_like(ours.W_Q.bias), ours.W_V.bias]))
    theirs.out_proj.load_state_dict(ours.W_O.state_dict())


@torch.no_grad()
def copy_from(reference: TextbookTransformer, model: nn.Module) -> None:
    """attnseq's weights into the reference, part by part."""
    encoder, decoder = model.encoder, model.decoder
    for theirs, mine in [(reference.src_embedding, encoder.embedding), (reference.tgt_embedding, decoder.embedding),
                         (reference.src_map, encoder.input_map), (reference.tgt_map, decoder.input_map),
                         (reference.transformer.encoder.norm, encoder.final_norm),
                         (reference.transformer.decoder.norm, decoder.final_norm), (reference.output, decoder.output)]:
        theirs.load_state_dict(mine.state_dict())
    for theirs, mine in zip(reference.transformer.encoder.layers, encoder.layers, strict=True):
        copy_attention(theirs.self_attn, mine.self_attention)
        for their, my in [(theirs.norm1, mine.attention_norm), (theirs.norm2, mine.feed_forward_norm),
                          (theirs.linear1, mine.feed_forward[0]), (theirs.linear2, mine.feed_forward[3])]:
            their.load_state_dict(my.state_dict())
    for theirs, mine in zip(reference.transformer.decoder.layers, decoder.layers, strict=True):
        copy_attention(theirs.self_attn, mine.self_attention)
        copy_attention(theirs.multihead_attn, mine.cross_attention)
        for their, my in [(theirs.norm1, mine.self_attention_norm), (theirs.norm2, mine.cross_attention_norm),
                          (theirs.norm3, mine.feed_forward_norm), (theirs.linear1, mine.feed_forward[0]),
                          (theirs.linear2, mine.feed_forward[3])]:
            their.load_state_dict(my.state_dict())


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def parameters_by_design(model: nn.Module, reference: TextbookTransformer) -> dict[str, int]:
    """Both models' parameter counts and what differs by design: attnseq's encoder has a bridge to an
    RNN decoder's first state (unused by decoder=transformer); torch's attentions have a key bias
    (d each, no effect on the output)."""
    attentions = [m for m in reference.modules() if isinstance(m, nn.MultiheadAttention)]
    return {
        "attnseq": count(model),
        REFERENCE: count(reference),
        "bridge": count(model.encoder.bridge),
        "key_biases": sum(m.embed_dim for m in attentions),
    }


# ---- decoding the same batches both ways


def emitted(tokens: Tensor) -> list[list[int]]:
    """Each row's tokens up to and including its EOS."""
    rows = []
    for row in tokens.tolist():
        rows.append(row[: row.index(EOS) + 1] if EOS in row else row)
    return rows


def decoders(model: nn.Module, reference: TextbookTransformer, rnn: nn.Module | None, rnn_name: str,
             beam: int) -> dict:
    """Each decoding timed: name → a function of (batch, limit) returning the emitted tokens per row."""
    def attnseq_greedy(m):
        return lambda batch, limit: emitted(
            greedy_decode(m, batch.src, batch.src_lengths, max_length=limit, keep_attention=False).tokens)

    def attnseq_beam(m):
        return lambda batch, limit: emitted(
            beam_search(m, batch.src, batch.src_lengths, beam_size=beam, max_length=limit).tokens)

    found = {
        "attnseq greedy (key/value cache)": attnseq_greedy(model),
        f"{REFERENCE} greedy (prefix recomputed)": lambda batch, limit: emitted(
            reference.greedy(batch.src, batch.src_lengths, limit)),
        f"attnseq beam {beam} (key/value cache)": attnseq_beam(model),
    }
    if rnn is not None:
        found[f"{rnn_name} greedy"] = attnseq_greedy(rnn)
        found[f"{rnn_name} beam {beam}"] = attnseq_beam(rnn)
    return found


@torch.no_grad()
def decoding(model: nn.Module, reference: TextbookTransformer, rnn: nn.Module | None, rnn_name: str, batches, cfg,
             device: str, repeats: int, beam: int = 5) -> dict:
    """Every decoder (``rnn``, an RNN decoder's model named ``rnn_name``, beside) over the same batches,
    ``repeats`` rounds alternating between them; per decoder the median sequences/s and tokens/s, and
    for how many sequences the reference's greedy output equals attnseq's."""
    for m in (model, reference, rnn):
        if m is not None:
            m.to(device).eval()
    limits = [decode_length_limit(b.src_lengths, cfg.decode.max_length_ratio, cfg.decode.max_length_extra)
              for b in batches]
    runs = decoders(model, reference, rnn, rnn_name, beam)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(repeats):
        for name, decode in runs.items():
            sync(device)
            began = time.perf_counter()
            out = [row for batch, limit in zip(batches, limits, strict=True) for row in decode(batch, limit)]
            sync(device)
            seconds[name].append(time.perf_counter() - began)
            outputs[name] = out
    sequences = sum(len(b) for b in batches)
    result = {}
    for name, times in seconds.items():
        tokens = sum(len(row) for row in outputs[name])
        median = sorted(times)[len(times) // 2]
        result[name] = {"seq_s": sequences / median, "tok_s": tokens / median, "tokens": tokens}
    ours, theirs = (outputs[name] for name in list(runs)[:2])
    result["same greedy output"] = sum(a == b for a, b in zip(ours, theirs, strict=True))
    result["sequences"] = sequences
    return result
