"""The encoder–decoder model, and the one function that builds it from a ``ModelConfig``."""

from __future__ import annotations

from torch import Tensor, nn

from attnseq.attention import build_attention, lengths_to_valid_mask
from attnseq.errors import ConfigError
from attnseq.kernels import DEFAULT_FAST_PATHS, FastPaths
from attnseq.model.config import ModelConfig
from attnseq.model.decoders import PlainDecoder, SequenceDecoder, TiedOutput
from attnseq.model.state import DecoderState, Memory


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

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def build_seq2seq(config: ModelConfig, fast_paths: FastPaths = DEFAULT_FAST_PATHS) -> Seq2Seq:
    """Validate the configuration, then build the model it describes, taking the fast paths
    ``fast_paths`` allows (they change the speed, never the values)."""
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
        return tied(Seq2Seq(encoder, PlainDecoder(**shared), config))

    def make_attention() -> nn.Module:
        return build_attention(config.scorer, config.query_dim, encoder.key_dim, heads=config.heads, local=local,
                               **config.scorer_options)

    return tied(Seq2Seq(encoder, convention.build_from(make_attention, **shared), config))


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
