"""The encoder–decoder model, and the one function that builds it from a ``ModelConfig``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from attnseq.attention import build_attention, lengths_to_valid_mask
from attnseq.data.vocab import BOS
from attnseq.errors import ConfigError
from attnseq.kernels import DEFAULT_FAST_PATHS, FastPaths
from attnseq.model.config import ModelConfig
from attnseq.model.decoders import PlainDecoder, SequenceDecoder, TiedOutput
from attnseq.model.initialization import initialize_
from attnseq.model.state import DecoderState, Memory


@dataclass(frozen=True)
class SelfAttention:
    """A batch's self-attention weights, one tensor per layer (first layer first), every head: the
    encoder's ``(B, H, T_enc, T_enc)`` (zero at padded keys) and the decoder's masked ``(B, H, T_dec, T_dec)``
    (zero above the diagonal); empty for a stack without self-attention (an RNN's)."""

    encoder: tuple[Tensor, ...] = ()
    decoder: tuple[Tensor, ...] = ()

    def of_row(self, row: int, src_length: int, tgt_length: int) -> dict[str, list[np.ndarray]]:
        """Row ``row``'s maps cut to its real positions, as float arrays by stack (``encoder``, ``decoder``;
        a stack without self-attention left out): per layer ``(H, n_src, n_src)`` or ``(H, n_tgt, n_tgt)``."""
        stacks = {"encoder": (self.encoder, src_length), "decoder": (self.decoder, tgt_length)}
        return {stack: [m[row, :, :n, :n].float().cpu().numpy() for m in maps]  # (H, n, n) each
                for stack, (maps, n) in stacks.items() if maps}


def decoder_inputs(outputs: Tensor) -> Tensor:
    """The decoder's inputs that produce the outputs ``(B, T)`` under teacher forcing: BOS, then each
    output but the last ``(B, T)``."""
    return torch.cat([torch.full_like(outputs[:, :1], BOS), outputs[:, :-1]], dim=1)  # (B, T)


class Seq2Seq(nn.Module):
    """An encoder (``RNNEncoder`` or ``TransformerEncoder``: ``attnseq.model.encoders``) + a decoder
    (a ``SequenceDecoder``: ``attnseq.model.conventions``).

    ``forward(src, src_lengths, tgt_in)`` → logits ``(B, T_dec, V)`` and attention
    ``(B, H, T_dec, T_enc)`` (None for the no-attention baseline).
    """

    def __init__(self, encoder: nn.Module, decoder: SequenceDecoder, config: ModelConfig | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.config = config

    @property
    def attention(self):
        return self.decoder.attention

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[Memory, DecoderState]:
        keys, final = self.encoder(src, src_lengths)  # (B, T_enc, d_k)
        valid_mask = lengths_to_valid_mask(src_lengths, src.shape[1])  # (B, T_enc)
        projected = self.decoder.project_keys(keys)  # (B, H, T_enc, d_p); None without attention
        return Memory(keys, valid_mask, projected), self.decoder.init_state(final)

    def forward(
        self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, teacher_forcing: float = 1.0
    ) -> tuple[Tensor, Tensor | None]:
        memory, state = self.encode(src, src_lengths)
        return self.decoder(tgt_in, state, memory, teacher_forcing=teacher_forcing)

    def self_attention(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> SelfAttention:
        """The self-attention weights of the batch, the decoder's under teacher forcing with ``tgt_in``
        ``(B, T_dec)`` (a decoded output's: ``decoder_inputs(tokens)``; causal, so a row's padding after its
        end changes nothing before it). Computed on demand by a pass of its own: ``forward`` and decoding
        neither compute nor keep anything for it. A stack whose settings do not declare ``self_attends``
        (``model.config.self_attending``) has none."""
        encoder_attends, decoder_attends = self.config.self_attending
        encoder = self.encoder.self_attention_weights(src, src_lengths) if encoder_attends else []
        decoder = []
        if decoder_attends:
            memory, state = self.encode(src, src_lengths)
            decoder = self.decoder.self_attention_weights(tgt_in, state, memory)
        return SelfAttention(tuple(encoder), tuple(decoder))

    @torch.no_grad()
    def sequence_self_attention(self, src: Tensor, outputs: Tensor) -> dict[str, list[np.ndarray]]:
        """One source ``src (T_src,)``'s self-attention as the model decoded ``outputs (T_out,)`` from it,
        ``self_attention`` of a batch of one cut by ``SelfAttention.of_row``: per stack, per layer ``(H, n, n)``;
        empty for a model without self-attention. What evaluation's and ``translate.py``'s figures draw."""
        device = next(self.parameters()).device
        src = src[None].to(device)  # (1, T_src)
        lengths = torch.tensor([src.shape[1]], device=device)  # (1,)
        maps = self.self_attention(src, lengths, decoder_inputs(outputs[None].to(device)))  # tgt_in (1, T_out)
        return maps.of_row(0, src.shape[1], outputs.shape[0])

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def build_seq2seq(config: ModelConfig, fast_paths: FastPaths = DEFAULT_FAST_PATHS) -> Seq2Seq:
    """Validate the configuration, then build the model it describes, its weights drawn by
    ``config.init``, taking the fast paths ``fast_paths`` allows (they change the speed, never the values)."""
    config.validate()
    _, encoder_settings, _, convention, local = config.parts()
    encoder = encoder_settings.build(config, fast_paths)
    shared = dict(
        vocab_size=config.tgt_vocab_size,
        embedding_dim=config.embedding_dim,
        hidden_size=config.hidden_size,
        cell=config.cell,
        layers=config.layers,
        dropout=config.dropout,
        fast_paths=fast_paths,
        tie_output=config.tie_output,
    )
    if not config.uses_attention:
        return initialize_(tied(Seq2Seq(encoder, PlainDecoder(**shared), config)), config.init)

    def make_attention() -> nn.Module:
        return build_attention(config.scorer, config.query_dim, encoder.key_dim, heads=config.heads, local=local,
                               **config.scorer_options)

    return initialize_(tied(Seq2Seq(encoder, convention.build_from(make_attention, **shared), config)), config.init)


def tied(model: Seq2Seq) -> Seq2Seq:
    """``model`` with the weights its config ties made one Parameter: the output layer's and the target
    embedding's (``model.tie_output``: the decoder builds it so), and the target embedding (with a tied
    output layer) made the source embedding's (``model.share_embeddings``; the source's initialisation
    is kept, as JoeyNMT's ``tied_embeddings`` and OpenNMT's ``share_embeddings`` keep it). A decoder
    or encoder that cannot is a ``ConfigError``, not an untied model."""
    config, decoder = model.config, model.decoder
    if config.tie_output and not any(isinstance(module, TiedOutput) for module in decoder.modules()):
        raise ConfigError(f"model.tie_output=true, but decoder={config.decoder} builds an output layer of its own.",
                          "set model.tie_output=false, or build the decoder's output layer with "
                          "attnseq.model.decoders.output_layer(..., tied=tie_output).")
    if not config.share_embeddings:
        return model
    source = getattr(model.encoder, "embedding", None)
    if not isinstance(source, nn.Embedding) or not isinstance(getattr(decoder, "embedding", None), nn.Embedding):
        raise ConfigError(
            f"model.share_embeddings=true, but encoder={config.encoder} or decoder={config.decoder} has no token "
            "embedding (an nn.Embedding named embedding) to share.",
            "set model.share_embeddings=false.",
        )
    decoder.share_embedding(source.weight)
    return model
