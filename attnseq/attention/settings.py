"""Each scorer's own settings (``conf/scorer/<name>.yaml``), as the typed model the config is
validated against before torch is imported; a scorer class links to its model as ``Settings``.

The capability the config check needs, ``same_size`` (the score compares query and key directly,
so d_q must equal d_k), lives here with the settings; ``Attention`` subclasses read it from them.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, PositiveInt

from attnseq.errors import ConfigError
from attnseq.problems import What
from attnseq.registry import Choice, Registry

NO_ATTENTION = "none"
"""The scorer name of the fixed-vector baseline: no attention at all."""


class ScorerSettings(Choice):
    """A scorer's settings; ``problems`` judges them against the sizes, before any tensor exists."""

    registry: ClassVar[Registry] = Registry("scorer", "scorer.name")
    same_size: ClassVar[bool] = False
    name: str

    def problems(self, query_dim: int, key_dim: int, heads: int) -> list[ConfigError]:
        return []


def size_problems(scorer: type[ScorerSettings], query_dim: int, key_dim: int, heads: int,
                  keys_come_from: str = "") -> list[ConfigError]:
    """What no scorer of this kind can work with: a same-size score with d_q != d_k, heads that do not
    divide d_k (``keys_come_from`` says where d_k comes from)."""
    found = []
    where = f"; d_k = {keys_come_from}" if keys_come_from else ""
    if scorer.same_size and query_dim != key_dim:
        others = [n for n, c in ScorerSettings.registry.items() if not c.same_size and n != NO_ATTENTION]
        found.append(ConfigError(
            f"scorer={scorer.choice_name()} compares the decoder query (B, d_q={query_dim}) with the encoder keys "
            f"(B, T_enc, d_k={key_dim}{where}) directly, which needs d_q == d_k.",
            f"use a scorer that maps one size to the other, e.g. {' or '.join(f'scorer={n}' for n in others)}, "
            "or a unidirectional encoder (encoder=gru or encoder=lstm).",
        ))
    return found + heads_problems("model.heads", heads, key_dim, "the key size", f"keys (B, T_enc, d_k={key_dim}"
                                  f"{where}) must split", "the key size (model.hidden_size)")


def heads_problems(key: str, heads: int, size: int, what: str, split: str, other: str) -> list[ConfigError]:
    """``key=heads`` does not divide ``size`` (``what``), which ``split`` into equal heads; or change ``other``."""
    if size % heads == 0:
        return []
    divisors = [h for h in range(1, size + 1) if size % h == 0][:8]
    return [ConfigError(f"{key}={heads} does not divide {what}: {split} into {heads} equal heads ({size} % {heads} = "
                        f"{size % heads}).", f"set {key} to one of {divisors}, e.g. {key}={divisors[-1]}, or change "
                        f"{other}.")]


def multiple_of_heads(key: str, value: int | None, heads: int, key_dim: int, why: str) -> list[ConfigError]:
    if value is None or value % heads == 0:
        return []
    return [ConfigError(
        f"scorer.{key}={value} must be a positive multiple of model.heads={heads}: {why}.",
        f"set scorer.{key} to a multiple of {heads}, e.g. scorer.{key}={heads * max(1, value // heads)}, "
        f"or leave it null (uses d_k={key_dim}).",
    )]


class NoAttentionSettings(ScorerSettings):
    name: Literal["none"] = "none"


class DotSettings(ScorerSettings):
    name: Literal["dot"] = "dot"
    same_size: ClassVar[bool] = True


class ScaledDotSettings(ScorerSettings):
    name: Literal["scaled_dot"] = "scaled_dot"
    same_size: ClassVar[bool] = True


class GeneralSettings(ScorerSettings):
    name: Literal["general"] = "general"


class UniformSettings(ScorerSettings):
    name: Literal["uniform"] = "uniform"


class AdditiveSettings(ScorerSettings):
    name: Literal["additive"] = "additive"
    attn_dim: PositiveInt | None = Field(None, le=2**16, description="the attention size d_attn (a multiple of "
                                         "model.heads, ≤ 65536); "
                                         "null = the key size", examples=[64])

    def problems(self, query_dim: int, key_dim: int, heads: int) -> list[ConfigError]:
        return multiple_of_heads("attn_dim", self.attn_dim, heads, key_dim,
                                 f"each head gets attn_dim / heads rows of W_a (d_attn, d_q={query_dim})")


class ConcatSettings(AdditiveSettings):
    name: Literal["concat"] = "concat"


class MultiheadSettings(ScorerSettings):
    name: Literal["multihead"] = "multihead"
    model_dim: PositiveInt | None = Field(None, description="the size queries, keys and values are projected to "
                                          "(a multiple of model.heads); null = the key size", examples=[64])

    def problems(self, query_dim: int, key_dim: int, heads: int) -> list[ConfigError]:
        return multiple_of_heads("model_dim", self.model_dim, heads, key_dim,
                                 f"queries, keys and values are projected to model_dim and split into {heads} "
                                 "heads of model_dim / heads")


# -- Luong's local attention (``attention.*``) ----------------------------------------------------------
LOCAL_ATTENTION = Registry("local attention", "attention.local", default="none", names_options=False)
"""Every kind of window around an aligned position p_t (Luong, Pham & Manning 2015, §3.2), by the name
``attention.local=<name>`` picks; ``none`` is global attention. The torch side of each kind is the
``LocalWindow`` class of ``attnseq.attention.local`` registered under the same name."""

DEFAULT_WINDOW = 10
"""D when ``attention.window`` is null: Luong et al.'s own choice."""


class LocalSettings(Choice):
    """``attention.*``: which positions each decoder step may attend to. Capabilities (class attributes):
    ``reads_step`` (p_t needs the decoder's step index t)."""

    registry: ClassVar[Registry] = LOCAL_ATTENTION
    reads_step: ClassVar[bool] = False
    local: str

    @property
    def is_local(self) -> bool:
        return self.local != "none"

    @property
    def half_width(self) -> int | None:
        """D, or None for global attention."""
        return None

    def problems(self, scorer: str) -> list[ConfigError]:
        return []


class GlobalSettings(LocalSettings):
    """Global attention: every real source position, as Bahdanau and Luong's global model."""

    local: Literal["none"] = "none"
    window: Annotated[None, What("null with attention.local=none (a window [p_t − D, p_t + D] is local attention's: "
                                 "attention.local=monotonic or predictive)")] = Field(
        None, description="D: local attention's window is [p_t − D, p_t + D] (null: 10); null with local=none",
        examples=[None])


class WindowedSettings(LocalSettings):
    """A local kind: the window [p_t − D, p_t + D] clipped to the real source positions."""

    window: PositiveInt | None = Field(None, le=2**16, description="D: the window [p_t − D, p_t + D]; null = 10 "
                                       "(Luong et al.'s)", examples=[10])

    @property
    def half_width(self) -> int:
        return DEFAULT_WINDOW if self.window is None else self.window

    def problems(self, scorer: str) -> list[ConfigError]:
        if scorer != NO_ATTENTION:
            return []
        return [ConfigError(
            f"attention.local={self.local} restricts the attention to a window, and scorer=none has no attention.",
            "pick a scorer, e.g. scorer=general (Luong's local-p with the general score), or set attention.local=none.",
        )]


class MonotonicSettings(WindowedSettings):
    """local-m: p_t = t, the decoder step (source and target roughly monotonically aligned)."""

    local: Literal["monotonic"] = "monotonic"
    reads_step: ClassVar[bool] = True


class PredictiveSettings(WindowedSettings):
    """local-p: p_t = S · sigmoid(v_pᵀ tanh(W_p q_t)), weights times a Gaussian of σ = D/2 around p_t."""

    local: Literal["predictive"] = "predictive"
