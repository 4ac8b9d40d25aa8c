"""Every kind of encoder by the name users pick it with (``kind`` in conf/encoder/<option>.yaml;
``rnn`` where an option does not say), its own settings, their checks, and how it is built.

An ``EncoderKind`` subclass that sets ``name`` registers itself here (as scorers do in
``attnseq.attention.registry``), so adding an encoder is one module class, one kind and one
conf/encoder/<option>.yaml whose keys besides ``SHARED_KEYS`` are the kind's ``options``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from attnseq.errors import ConfigError
from attnseq.kernels import ALL_FAST_PATHS, FastPaths
from attnseq.model.encoder import RNNEncoder
from attnseq.model.transformer_encoder import TransformerEncoder

if TYPE_CHECKING:
    from attnseq.model.config import ModelConfig

RNN = "rnn"
"""The kind of conf/encoder/gru.yaml, lstm.yaml and bigru.yaml: ``RNNEncoder``."""

SHARED_KEYS = ("name", "kind", "cell", "bidirectional")
"""Keys of conf/encoder/<option>.yaml that ``ModelConfig`` reads itself; the others are the kind's settings."""

ENCODER_KINDS: dict[str, type[EncoderKind]] = {}
"""Every registered encoder kind by its ``name``."""


class EncoderKind:
    """How one kind of encoder is checked and built from a ``ModelConfig``."""

    name: ClassVar[str]
    options: ClassVar[Mapping[str, Any]] = {}
    """The kind's own settings (``encoder.<key>``) with their defaults."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in vars(cls):
            taken = ENCODER_KINDS.get(cls.name)
            if taken is not None and taken.__qualname__ != cls.__qualname__:
                raise TypeError(f"{cls.__qualname__}: the encoder kind {cls.name!r} is taken by {taken.__qualname__}.")
            ENCODER_KINDS[cls.name] = cls

    @classmethod
    def settings(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` completed with the defaults; one this kind does not take raises ``ConfigError``."""
        unknown = sorted(set(options) - set(cls.options))
        if unknown:
            takes = ", ".join(f"encoder.{key}" for key in cls.options) or "no settings of its own"
            raise ConfigError(
                f"encoder.{unknown[0]} is not a setting of an encoder of kind {cls.name} (it takes {takes}).",
                f"drop encoder.{unknown[0]} (on the command line: ~encoder.{unknown[0]}), or pick an encoder "
                "whose conf/encoder/<option>.yaml lists it.",
            )
        return {**cls.options, **options}

    @classmethod
    def check(cls, config: ModelConfig, settings: Mapping[str, Any]) -> None:
        """Raise ``ConfigError`` when ``settings`` cannot work with the rest of ``config``."""

    @classmethod
    def build(
        cls, config: ModelConfig, settings: Mapping[str, Any], fast_paths: FastPaths = ALL_FAST_PATHS
    ) -> nn.Module:
        """The encoder module: ``forward(src, src_lengths)`` → keys ``(B, T_enc, d_k)`` and the decoder's
        initial RNN state; it has ``key_dim``."""
        raise NotImplementedError


class RecurrentEncoderKind(EncoderKind):
    """A (bi)GRU/LSTM over the source: ``RNNEncoder``; its cell is the decoder's too."""

    name = RNN

    @classmethod
    def build(
        cls, config: ModelConfig, settings: Mapping[str, Any], fast_paths: FastPaths = ALL_FAST_PATHS
    ) -> nn.Module:
        return RNNEncoder(
            config.src_vocab_size,
            config.embedding_dim,
            config.hidden_size,
            cell=config.cell,
            bidirectional=config.bidirectional,
            layers=config.layers,
            dropout=config.dropout,
            fast_paths=fast_paths,
        )


class TransformerEncoderKind(EncoderKind):
    """Self-attention layers over the source: ``TransformerEncoder``. ``encoder.cell`` is the decoder's
    cell (the encoder has none); ``model.layers`` the decoder's depth."""

    name = "transformer"
    options = {"layers": 2, "heads": 4, "ff_dim": 256}

    @classmethod
    def check(cls, config: ModelConfig, settings: Mapping[str, Any]) -> None:
        for key in ("layers", "heads", "ff_dim"):
            value = settings[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"encoder.{key}={value!r} must be a whole number ≥ 1.",
                    f"set encoder.{key}={cls.options[key]}, say.",
                )
        hidden, heads = config.hidden_size, settings["heads"]
        if hidden % heads:
            divisors = [h for h in range(1, hidden + 1) if hidden % h == 0][:8]
            raise ConfigError(
                f"encoder.heads={heads} does not divide model.hidden_size={hidden}: the self-attention splits "
                f"its queries, keys and values (d={hidden}) into {heads} equal heads ({hidden} % {heads} = "
                f"{hidden % heads}).",
                f"set encoder.heads to one of {divisors}, or change model.hidden_size.",
            )
        if config.bidirectional:
            raise ConfigError(
                "encoder.bidirectional=true with encoder=transformer: self-attention reads the whole source "
                "in both directions already, and its keys are model.hidden_size wide.",
                "drop encoder.bidirectional (it is false in conf/encoder/transformer.yaml).",
            )

    @classmethod
    def build(
        cls, config: ModelConfig, settings: Mapping[str, Any], fast_paths: FastPaths = ALL_FAST_PATHS
    ) -> nn.Module:
        return TransformerEncoder(
            config.src_vocab_size,
            config.embedding_dim,
            config.hidden_size,
            layers=settings["layers"],
            heads=settings["heads"],
            ff_dim=settings["ff_dim"],
            dropout=config.dropout,
            decoder_cell=config.cell,
            decoder_layers=config.layers,
        )


def encoder_kind(name: str) -> type[EncoderKind]:
    """The kind registered as ``name``; an unknown one raises ``ConfigError`` listing the known ones."""
    if name not in ENCODER_KINDS:
        raise ConfigError(
            f"unknown encoder kind {name!r} (encoder.kind).",
            f"use encoder.kind= one of {list(ENCODER_KINDS)}, or pick an option of conf/encoder/ "
            "(encoder=gru, encoder=transformer, ...); a kind defined outside attnseq is registered by "
            "importing its module first: plugins=[your.module].",
        )
    return ENCODER_KINDS[name]
