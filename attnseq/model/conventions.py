"""Every decoder convention by the name users pick it with (``decoder=<convention>``): its settings
model and the decoder it builds.

A ``DecoderSettings`` subclass whose ``convention`` is a ``Literal`` of its name registers itself,
so adding a convention is one class (its settings and ``build``) and one conf/decoder/<name>.yaml.
Torch-free at import: the decoder modules are imported by ``build``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field

from attnseq.errors import ConfigError
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


def decoder_convention(name: str) -> type[DecoderSettings]:
    return DECODER_CONVENTIONS.lookup(name)
