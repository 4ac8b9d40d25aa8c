"""Every decoder convention by the name users pick it with (``decoder=<convention>``): its settings
model and the decoder it builds.

A ``DecoderSettings`` subclass whose ``convention`` is a ``Literal`` of its name registers itself,
so adding a convention is one class (its settings and ``build``) and one conf/decoder/<name>.yaml.
Torch-free at import: the decoder modules are imported by ``build``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, PositiveInt

from attnseq.errors import ConfigError
from attnseq.model.encoders import self_attention_heads
from attnseq.problems import What
from attnseq.registry import Choice, Registry

if TYPE_CHECKING:
    from torch import nn

DECODER_CONVENTIONS = Registry("decoder convention", "decoder.convention")
"""Every registered decoder convention by its name."""


class DecoderSettings(Choice):
    """A decoder convention's settings (conf/decoder/<name>.yaml); ``build`` makes its decoder."""

    registry: ClassVar[Registry] = DECODER_CONVENTIONS
    convention: str

    @property
    def feeds_input(self) -> bool:
        """Whether h̃_{t-1} is fed into the next step (Luong's input feeding)."""
        return False

    needs_attention: ClassVar[bool] = False
    """True for a decoder that reads the source through its attention alone (``scorer=none`` cannot work)."""

    self_attends: ClassVar[bool] = False
    """True for a decoder whose module has ``self_attention_weights(tgt_in, state, memory)``: each layer's
    masked ``(B, H, T_dec, T_dec)`` (``Seq2Seq.self_attention``; drawn beside the cross-attention heatmaps)."""

    @property
    def options(self) -> dict[str, Any]:
        """The convention's own settings past ``convention`` and ``input_feeding`` (saved with the model)."""
        return self.model_dump(exclude={"convention", "input_feeding"})

    def size_problems(self, hidden_size: int) -> list[ConfigError]:
        """What cannot work with the model's sizes, before any tensor exists."""
        return []

    variants: ClassVar[dict[str, tuple[str, ...]]] = {}
    """The benchmark's cases of this convention by name, each with its overrides (empty: one case
    named after the convention, as its yaml file has it)."""

    def problems(self) -> list[ConfigError]:
        return []

    @classmethod
    def cases(cls) -> dict[str, tuple[str, ...]]:
        """The benchmark's cases of this convention: name → the overrides that select it."""
        name = cls.choice_name()
        return {case: (f"decoder={name}", *overrides) for case, overrides in (cls.variants or {name: ()}).items()}

    def build(self, attention: nn.Module, **shared: Any) -> nn.Module:
        """The decoder around ``attention`` (``shared``: vocabulary size, sizes, cell, fast paths)."""
        raise NotImplementedError

    def build_from(self, make_attention: Callable[[], nn.Module], **shared: Any) -> nn.Module:
        """The decoder, given a maker of its attention (each call: one new mechanism, as the config
        describes it); a convention with one mechanism builds around one: ``build``."""
        return self.build(make_attention(), **shared)


class BahdanauConvention(DecoderSettings):
    """Query with s_{t-1} (before the RNN step); the context feeds the RNN input."""

    convention: Literal["bahdanau"] = "bahdanau"
    input_feeding: Annotated[None, What(
        "null with decoder=bahdanau (input feeding passes Luong's h̃_{t-1} into the next step; use decoder=luong "
        "for it)",
    )] = Field(None, description="Luong only: the Bahdanau convention has nothing to feed", examples=[None])

    def build(self, attention: nn.Module, **shared: Any) -> nn.Module:
        from attnseq.model.decoders import BahdanauDecoder

        return BahdanauDecoder(attention, **shared)


class LuongConvention(DecoderSettings):
    """Query with s_t (after the RNN step); h̃_t = tanh(W_c [c_t; s_t])."""

    convention: Literal["luong"] = "luong"
    variants: ClassVar[dict[str, tuple[str, ...]]] = {
        "luong": ("decoder.input_feeding=true",),  # query s_t, with input feeding
        "luong-nofeed": ("decoder.input_feeding=false",),  # without: all steps in one call
    }
    input_feeding: bool | None = Field(None, description="feed h̃_{t-1} into the next step (null: on)")

    @property
    def feeds_input(self) -> bool:
        return self.input_feeding is not False

    def build(self, attention: nn.Module, **shared: Any) -> nn.Module:
        from attnseq.model.decoders import LuongDecoder

        return LuongDecoder(attention, input_feeding=self.feeds_input, **shared)


class TransformerConvention(DecoderSettings):
    """N pre-norm layers of masked self-attention, cross-attention (the scorer; ``multihead`` is
    Vaswani's) and a feed-forward block, sinusoidal positions; decodes with a key/value cache."""

    convention: Literal["transformer"] = "transformer"
    needs_attention: ClassVar[bool] = True
    self_attends: ClassVar[bool] = True
    layers: PositiveInt = Field(2, le=64, description="decoder layers (model.layers is only an RNN encoder's depth)")
    heads: PositiveInt = Field(4, description="self-attention heads (model.heads are the cross-attention heads); "
                               "must divide model.hidden_size")
    ff_dim: PositiveInt = Field(256, le=2**16, description="the feed-forward block's inner size")
    shown_layer: PositiveInt | None = Field(None, description="the layer whose cross-attention the heatmaps and "
                                            "alignment metrics read (1 = the first); null = every layer's heads, "
                                            "layer after layer", examples=[2])

    def size_problems(self, hidden_size: int) -> list[ConfigError]:
        found = self_attention_heads("decoder.heads", self.heads, hidden_size)
        if self.shown_layer is not None and self.shown_layer > self.layers:
            found.append(ConfigError(
                f"decoder.shown_layer={self.shown_layer} is past the decoder's decoder.layers={self.layers} layers.",
                f"set decoder.shown_layer to 1 … {self.layers}, e.g. decoder.shown_layer={self.layers}, "
                "or null for every layer.",
            ))
        return found

    def build_from(self, make_attention: Callable[[], nn.Module], **shared: Any) -> nn.Module:
        from attnseq.model.transformer_decoder import TransformerDecoder

        return TransformerDecoder([make_attention() for _ in range(self.layers)], shared["vocab_size"],
                                  shared["embedding_dim"], shared["hidden_size"], heads=self.heads,
                                  ff_dim=self.ff_dim, dropout=shared["dropout"], shown_layer=self.shown_layer,
                                  tie_output=shared["tie_output"], fast_paths=shared["fast_paths"])


def decoder_convention(name: str) -> type[DecoderSettings]:
    return DECODER_CONVENTIONS.lookup(name)
