"""Every kind of encoder by the name users pick it with (``kind`` in conf/encoder/<option>.yaml;
``rnn`` where an option does not say): its settings model, their checks, and how it is built.

An ``EncoderSettings`` subclass whose ``kind`` is a ``Literal`` of its name registers itself, so
adding an encoder is one class (its settings, ``key_dim`` and ``build``) and one
conf/encoder/<option>.yaml. Torch-free at import: the modules are imported by ``build``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from pydantic import Field, PositiveInt

from attnseq.attention.settings import heads_problems
from attnseq.errors import ConfigError
from attnseq.registry import Choice, Registry

if TYPE_CHECKING:
    from torch import nn

    from attnseq.kernels import FastPaths


class ModelSizes(Protocol):
    """What an encoder reads of the model's config (``attnseq.model.config.ModelConfig`` has it)."""

    src_vocab_size: int
    embedding_dim: int
    hidden_size: int
    layers: int  # the decoder's depth (an RNN encoder's too)
    dropout: float


RNN = "rnn"
"""The kind of conf/encoder/gru.yaml, lstm.yaml and bigru.yaml: ``RNNEncoder``."""

ENCODER_KINDS = Registry("encoder kind", "encoder.kind", default=RNN, names_options=False)
"""Every registered encoder kind by its ``kind``."""


class EncoderSettings(Choice):
    """What every conf/encoder/<option>.yaml holds; a kind adds its own settings."""

    registry: ClassVar[Registry] = ENCODER_KINDS
    name: str = Field(RNN, min_length=1, description="the option's name (conf/encoder/<name>.yaml)", examples=["gru"])
    kind: str = RNN
    cell: Literal["gru", "lstm"] = Field("gru", description="the RNN cell (the decoder's too)")
    bidirectional: bool = Field(False, description="read the source both ways (keys 2 × model.hidden_size wide)")

    self_attends: ClassVar[bool] = False
    """True for an encoder whose module has ``self_attention_weights(src, src_lengths)``: each layer's
    ``(B, H, T_enc, T_enc)`` (``Seq2Seq.self_attention``; drawn beside the cross-attention heatmaps)."""

    @property
    def options(self) -> dict[str, Any]:
        """The kind's own settings: the fields past the shared ones."""
        return self.model_dump(exclude=set(EncoderSettings.model_fields))

    def key_dim(self, hidden_size: int) -> int:
        """d_k: the size of the keys the encoder gives the attention."""
        return hidden_size * (2 if self.bidirectional else 1)

    def problems(self, hidden_size: int) -> list[ConfigError]:
        """What cannot work with the rest of the model config, before any tensor exists."""
        return []

    def build(self, config: ModelSizes, fast_paths: FastPaths | None = None) -> nn.Module:
        """The encoder module: ``forward(src, src_lengths)`` → keys ``(B, T_enc, d_k)`` and the decoder's
        initial RNN state; it has ``key_dim``."""
        raise NotImplementedError


class RecurrentEncoder(EncoderSettings):
    """A (bi)GRU/LSTM over the source: ``RNNEncoder``; its cell is the decoder's too."""

    kind: Literal["rnn"] = RNN

    def build(self, config: ModelSizes, fast_paths: FastPaths | None = None) -> nn.Module:
        from attnseq.kernels import DEFAULT_FAST_PATHS
        from attnseq.model.rnn_encoder import RNNEncoder

        return RNNEncoder(config.src_vocab_size, config.embedding_dim, config.hidden_size, cell=self.cell,
                          bidirectional=self.bidirectional, layers=config.layers, dropout=config.dropout,
                          fast_paths=fast_paths or DEFAULT_FAST_PATHS)


class TransformerEncoderSettings(EncoderSettings):
    """Self-attention layers over the source: ``TransformerEncoder``. ``encoder.cell`` is the decoder's
    cell (the encoder has none); ``model.layers`` the decoder's depth."""

    kind: Literal["transformer"] = "transformer"
    self_attends: ClassVar[bool] = True
    layers: PositiveInt = Field(2, description="self-attention layers")
    heads: PositiveInt = Field(4, description="self-attention heads (model.heads are the decoder's "
                               "cross-attention heads); must divide model.hidden_size")
    ff_dim: PositiveInt = Field(256, description="the feed-forward block's inner size")

    def key_dim(self, hidden_size: int) -> int:
        return hidden_size

    def problems(self, hidden_size: int) -> list[ConfigError]:
        found = self_attention_heads("encoder.heads", self.heads, hidden_size)
        if self.bidirectional:
            found.append(ConfigError(
                "encoder.bidirectional=true with encoder=transformer: self-attention reads the whole source "
                "in both directions already, and its keys are model.hidden_size wide.",
                "drop encoder.bidirectional, e.g. encoder.bidirectional=false (as in conf/encoder/transformer.yaml).",
            ))
        return found

    def build(self, config: ModelSizes, fast_paths: FastPaths | None = None) -> nn.Module:
        from attnseq.model.transformer_encoder import TransformerEncoder

        return TransformerEncoder(config.src_vocab_size, config.embedding_dim, config.hidden_size,
                                  layers=self.layers, heads=self.heads, ff_dim=self.ff_dim, dropout=config.dropout,
                                  decoder_cell=self.cell, decoder_layers=config.layers)


def self_attention_heads(key: str, heads: int, hidden_size: int) -> list[ConfigError]:
    """A self-attention's heads (``key``) that do not divide the states' width d = ``model.hidden_size``."""
    return heads_problems(key, heads, hidden_size, f"model.hidden_size={hidden_size}",
                          f"the self-attention splits its queries, keys and values (d={hidden_size})",
                          "model.hidden_size")


def encoder_kind(name: str) -> type[EncoderSettings]:
    """The kind registered as ``name``; an unknown one raises ``ConfigError`` listing the known ones."""
    return ENCODER_KINDS.lookup(name)
