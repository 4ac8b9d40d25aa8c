"""The model's typed configuration, and the checks that reject a bad combination before any
tensor exists. Messages speak in the user's config keys (``model.heads``, ``encoder=bigru``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from attnseq.attention import NO_ATTENTION, import_plugins, scorer_class, scorer_names
from attnseq.errors import ConfigError
from attnseq.model.encoders import RNN, encoder_kind

CELLS = ("gru", "lstm")
DECODERS = ("bahdanau", "luong")


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
    """The decoder's RNN cell, and the encoder's when the encoder is recurrent."""
    bidirectional: bool = False
    encoder: str = RNN
    """The encoder's kind (``attnseq.model.encoders``): ``rnn`` or ``transformer``."""
    encoder_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """The encoder kind's own settings: ``conf/encoder/<option>.yaml`` less its shared keys (e.g. ``heads``)."""
    scorer: str = "additive"
    scorer_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """The scorer's own settings: ``conf/scorer/<name>.yaml`` less ``name`` (e.g. ``attn_dim``)."""
    heads: int = 1
    decoder: str = "bahdanau"
    input_feeding: bool | None = None
    """Luong only: feed h̃_{t-1} into the next step (None: on). Setting it True with
    ``decoder=bahdanau`` is an error; the Bahdanau convention has nothing to feed."""
    plugins: tuple[str, ...] = ()
    """Modules imported before validation, so that the scorers they define are registered."""

    @classmethod
    def from_saved(cls, saved: Mapping[str, Any]) -> ModelConfig:
        """The config a run saved with its weights (``dataclasses.asdict``), including those saved
        before the scorer's settings moved to its own group (a top-level ``attn_dim``)."""
        fields = dict(saved)
        options = dict(fields.pop("scorer_options", None) or {})
        attn_dim = fields.pop("attn_dim", None)
        if attn_dim is not None:
            options.setdefault("attn_dim", attn_dim)
        if fields.get("decoder") == "bahdanau":
            fields["input_feeding"] = None  # saved as a meaningless True/False before
        fields["plugins"] = tuple(fields.get("plugins", ()))
        return cls(**fields, scorer_options=options)

    @property
    def feeds_input(self) -> bool:
        """Whether the decoder is Luong's with input feeding."""
        return self.decoder == "luong" and self.input_feeding is not False

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
        import_plugins(self.plugins)
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
        if self.decoder == "bahdanau" and self.input_feeding:
            raise ConfigError(
                "decoder.input_feeding=true with decoder=bahdanau: input feeding passes Luong's "
                "attentional state h̃_{t-1} into the next step, which the Bahdanau convention does not have.",
                "drop decoder.input_feeding, or use decoder=luong.",
            )
        kind = encoder_kind(self.encoder)
        kind.check(self, kind.settings(self.encoder_options))
        if not self.uses_attention:
            return
        scorer = scorer_class(self.scorer)
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
        if scorer.same_size and d_q != d_k:
            raise ConfigError(
                f"scorer={self.scorer} compares the decoder query (B, d_q={d_q}) with the encoder "
                f"keys (B, T_enc, d_k={d_k}; d_k = {keys_come_from}) directly, which needs "
                f"d_q == d_k.",
                f"use a scorer that maps one size to the other, e.g. "
                f"{' or '.join(f'scorer={name}' for name in scorer_names(same_size=False))}, "
                "or a unidirectional encoder (encoder=gru or encoder=lstm).",
            )
        if d_k % heads != 0:
            divisors = [h for h in range(1, d_k + 1) if d_k % h == 0][:8]
            raise ConfigError(
                f"model.heads={heads} does not divide the key size: keys (B, T_enc, d_k={d_k}; "
                f"d_k = {keys_come_from}) must split into {heads} equal heads "
                f"({d_k} % {heads} = {d_k % heads}).",
                f"set model.heads to one of {divisors}, or change model.hidden_size.",
            )
        scorer.check_settings(d_q, d_k, heads, scorer.settings(self.scorer_options))
