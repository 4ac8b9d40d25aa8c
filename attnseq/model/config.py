"""The model's typed configuration, and the checks that reject a bad combination before any
tensor exists. Messages speak in the user's config keys (``model.heads``, ``encoder=bigru``)."""

from __future__ import annotations

from dataclasses import dataclass

from attnseq.attention import NO_ATTENTION, SCORERS
from attnseq.errors import ConfigError

CELLS = ("gru", "lstm")
DECODERS = ("bahdanau", "luong")
SAME_SIZE_SCORERS = ("dot", "scaled_dot")


@dataclass(frozen=True)
class ModelConfig:
    """Everything that fixes a Seq2Seq model's architecture and parameter count."""

    src_vocab_size: int
    tgt_vocab_size: int
    embedding_dim: int = 64
    hidden_size: int = 128
    layers: int = 1
    dropout: float = 0.0
    cell: str = "gru"
    bidirectional: bool = False
    scorer: str = "additive"
    attn_dim: int | None = None
    heads: int = 1
    decoder: str = "bahdanau"
    input_feeding: bool = True

    @property
    def query_dim(self) -> int:
        """d_q: the decoder state that queries the encoder (top layer)."""
        return self.hidden_size

    @property
    def key_dim(self) -> int:
        """d_k: the encoder states' size; twice the hidden size when bidirectional."""
        return self.hidden_size * (2 if self.bidirectional else 1)

    @property
    def uses_attention(self) -> bool:
        return self.scorer != NO_ATTENTION

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the value, the shapes involved and the fix."""
        for key in ("src_vocab_size", "tgt_vocab_size", "embedding_dim", "hidden_size", "layers"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"model.{key}={value!r} must be a positive integer.",
                    f"set model.{key} to a whole number ≥ 1.",
                )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(
                f"model.dropout={self.dropout!r} must lie in [0, 1).", "set model.dropout=0.1, say."
            )
        if self.cell not in CELLS:
            raise ConfigError(f"unknown encoder cell {self.cell!r}.", f"use one of {list(CELLS)}.")
        if self.decoder not in DECODERS:
            raise ConfigError(
                f"unknown decoder convention {self.decoder!r}.", f"use decoder= one of {list(DECODERS)}."
            )
        if self.scorer != NO_ATTENTION and self.scorer not in SCORERS:
            raise ConfigError(
                f"unknown scorer {self.scorer!r}.",
                f"use scorer= one of {[NO_ATTENTION, *SCORERS]}.",
            )
        if not self.uses_attention:
            return
        if not isinstance(self.heads, int) or isinstance(self.heads, bool) or self.heads < 1:
            raise ConfigError(
                f"model.heads={self.heads!r} must be a positive integer.", "set model.heads=1."
            )
        d_q, d_k, heads = self.query_dim, self.key_dim, self.heads
        keys_come_from = (
            f"2 × model.hidden_size={self.hidden_size}, since the encoder is bidirectional"
            if self.bidirectional
            else f"model.hidden_size={self.hidden_size}"
        )
        if self.scorer in SAME_SIZE_SCORERS and d_q != d_k:
            raise ConfigError(
                f"scorer={self.scorer} compares the decoder query (B, d_q={d_q}) with the encoder "
                f"keys (B, T_enc, d_k={d_k}; d_k = {keys_come_from}) by a dot product, which needs "
                f"d_q == d_k.",
                f"use scorer=general (learns W of shape ({d_q}, {d_k})), scorer=additive or "
                "scorer=concat, or a unidirectional encoder (encoder=gru or encoder=lstm).",
            )
        if d_k % heads != 0:
            divisors = [h for h in range(1, d_k + 1) if d_k % h == 0][:8]
            raise ConfigError(
                f"model.heads={heads} does not divide the key size: keys (B, T_enc, d_k={d_k}; "
                f"d_k = {keys_come_from}) must split into {heads} equal heads "
                f"({d_k} % {heads} = {d_k % heads}).",
                f"set model.heads to one of {divisors}, or change model.hidden_size.",
            )
        if self.scorer in ("additive", "concat"):
            attn_dim = d_k if self.attn_dim is None else self.attn_dim
            if not isinstance(attn_dim, int) or attn_dim < 1 or attn_dim % heads != 0:
                raise ConfigError(
                    f"model.attn_dim={attn_dim!r} must be a positive multiple of model.heads={heads}: "
                    f"each head gets attn_dim / heads rows of W_a (d_attn, d_q={d_q}).",
                    f"set model.attn_dim to a multiple of {heads}, or leave it null (uses d_k={d_k}).",
                )
