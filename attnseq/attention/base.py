"""The call signature every attention mechanism shares, and what a scorer class declares.

``context, weights = attention(query, keys, valid_mask)``

- ``query``: ``(B, d_q)`` for one decoder step, or ``(B, T_dec, d_q)`` for all steps at once;
- ``keys``: ``(B, T_enc, d_k)``; in classic attention the keys are also the values;
- ``valid_mask``: ``(B, T_enc)`` bool, True at real tokens;
- returns ``context`` ``(B, d_k)`` / ``(B, T_dec, d_k)`` and ``weights`` ``(B, H, T_enc)`` /
  ``(B, H, T_dec, T_enc)``, H the head count;
- ``step`` (optional): the target step t of the (first) query, read by local-m attention only.

Any scorer may attend within a local window (``window``, Luong's local-m or local-p:
``attnseq.attention.local``), set after construction; the weights then come from the window.

With H heads the key size is split into H groups of ``d_k / H``; each head scores and averages
its own slice, and the per-head contexts are concatenated back to ``d_k``. A scorer that learns
its values too (``values_are_keys = False``: multihead's W_V and W_O) overrides ``average``.

Keys are projected once per batch: a decoder calls ``project_keys(keys)`` before its loop and
passes the result as ``projected_keys`` at every step (everything the scorer derives from the keys
alone, its projected values included). Nothing is kept on the module between calls. The maths and
conventions: docs/attention.md.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import create_model
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from attnseq.attention.local import LocalWindow
from attnseq.attention.masking import masked_softmax
from attnseq.attention.registry import NO_ATTENTION, SCORERS
from attnseq.attention.settings import ScorerSettings, size_problems
from attnseq.errors import ConfigError, ShapeError

DEFINED_BY_THE_BASE = ("forward", "score")
"""Methods a scorer must not override: its score is its parts (``project_keys``, ``query_weight``,
``split_query``, ``score_projected``), so that a fused decoder calling the parts computes what
``forward`` computes."""


class Attention(nn.Module):
    """Base class: shape checks, masking, multi-head split and the weighted average of values.

    A scorer is a subclass that sets ``name`` (which registers it, ``scorer=<name>``), declares
    its settings as a pydantic ``Settings`` model (a ``ScorerSettings``; the constructor takes its
    fields as keyword arguments) and its capabilities as the class attributes below, and implements
    the parts of its score:
    ``project_keys`` (once per batch), ``query_weight`` (optional), ``split_query`` and
    ``score_projected``.
    """

    name: ClassVar[str] = "attention"
    """The name users pick the scorer with; a class that sets it in its own body is registered."""
    same_size: ClassVar[bool] = False
    """True when the score compares query and key directly, so d_q must equal d_k (read from
    ``Settings`` where it declares it: the config check needs it before torch is imported)."""
    Settings: ClassVar[type[ScorerSettings]] = ScorerSettings
    """The scorer's own settings (the keys of ``conf/scorer/<name>.yaml`` besides ``name``)."""
    fused_recurrence: ClassVar[str | None] = None
    """The kernel of ``attnseq.kernels`` that computes exactly this score inside a fused decoder
    recurrence, or None: ``"additive"``: e = vᵀ tanh(W_q s + K); ``"multiplicative"``: e_h = λ q_hᵀ K_h
    with q the query itself (no ``query_weight``), each head its slice of it or, when K_h is as wide
    as the query, all of it, and λ the scorer's ``score_scale()``; K = ``project_keys`` in both. Read
    from the class's own body only: a subclass that does not declare it again has none, whatever its
    parent's, since a subclass may change the score."""
    values_are_keys: ClassVar[bool] = True
    """True when the context is the weights times each head's own slice of the keys (``average``
    as defined here), which the fused Bahdanau loop computes itself; False for a scorer that learns
    its values (multihead): it overrides ``average`` and ``values_through``, and a Bahdanau decoder
    calls it step by step."""
    content_based: ClassVar[bool] = True
    """True when the weights depend on the query and the keys; False for a scorer whose weights the
    valid mask alone fixes (uniform: 1/|x| at every real position), so no gradient reaches the query
    through them and a different query gives the same weights."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for method in DEFINED_BY_THE_BASE:
            if method in vars(cls):
                raise TypeError(
                    f"{cls.__qualname__} overrides Attention.{method}: a scorer defines the parts of its "
                    "score (project_keys, query_weight, split_query, score_projected) and nothing else."
                )
        if "fused_recurrence" not in vars(cls):
            cls.fused_recurrence = None
        if "name" in vars(cls):
            if cls.name == NO_ATTENTION:
                raise TypeError(f"{cls.__qualname__}: the scorer name {NO_ATTENTION!r} is the no-attention "
                                "baseline's.")
            cls.Settings = _settings_of(cls)
            cls.same_size = cls.Settings.same_size
            SCORERS.add(cls.name, cls)

    @classmethod
    def settings(cls, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` validated by the scorer's ``Settings`` and completed with their defaults."""
        from attnseq.problems import validated

        return validated(cls.Settings, {"name": cls.name, **options}, prefix="scorer").model_dump(exclude={"name"})

    def check_settings(self, **settings: Any) -> None:
        """Raise ``ConfigError`` when this scorer's settings cannot work with its sizes."""
        from attnseq.problems import validated

        checked = validated(self.Settings, {"name": self.name, **settings}, prefix="scorer")
        problems = checked.problems(self.query_dim, self.key_dim, self.heads)
        if problems:
            raise problems[0]

    def __init__(self, query_dim: int, key_dim: int, heads: int = 1) -> None:
        super().__init__()
        for label, value in (("query_dim", query_dim), ("key_dim", key_dim), ("heads", heads)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"{self.name} attention: {label}={value!r} must be a positive integer.",
                    f"set {label} to a whole number ≥ 1.",
                )
        problems = size_problems(self.Settings, query_dim, key_dim, heads)
        if problems:
            raise problems[0]
        self.query_dim = query_dim
        self.key_dim = key_dim
        self.heads = heads
        self.head_dim = key_dim // heads
        self.window: LocalWindow | None = None
        """Luong's local attention (``attnseq.attention.local``, ``attention.local``), or None: global.
        Set after construction (``build_attention(..., local=...)``), so that any scorer takes it."""
        self.hook_handles: list[RemovableHandle] = []
        """The handles of the forward hooks and pre-hooks registered on it (``hooked``)."""

    # -- hooks ----------------------------------------------------------------------------
    def register_forward_hook(self, hook: Any, *args: Any, **kwargs: Any) -> RemovableHandle:
        handle = super().register_forward_hook(hook, *args, **kwargs)
        self.hook_handles.append(handle)
        return handle

    def register_forward_pre_hook(self, hook: Any, *args: Any, **kwargs: Any) -> RemovableHandle:
        handle = super().register_forward_pre_hook(hook, *args, **kwargs)
        self.hook_handles.append(handle)
        return handle

    def hooked(self) -> bool:
        """Whether a forward hook or pre-hook registered on it is still on (not removed), read through
        the handles' public ``id`` and hook dictionary: a hooked attention must see every call."""
        return any(handle.id in (handle.hooks_dict_ref() or {}) for handle in self.hook_handles)

    # -- what a scorer defines ------------------------------------------------------------
    def project_keys(self, keys: Tensor) -> Tensor:
        """Keys in the scorer's comparison space, split by head: ``(B, H, T_enc, d_p)``."""
        raise NotImplementedError

    def query_weight(self) -> Tensor | None:
        """The linear map ``(d_p·H, d_q)`` a scorer applies to the query first, or None (used as is).

        Exposed so that a decoder can fuse it with the other products of the same state (the
        Bahdanau decoder computes ``W_hh s_{t-1}`` and ``W_a s_{t-1}`` in one matmul).
        """
        return None

    def split_query(self, query: Tensor) -> Tensor:
        """The (already ``query_weight``-mapped) query ``(B, T_dec, ·)`` → ``(B, H or 1, T_dec, d_p)``
        (1: every head compares the same query)."""
        raise NotImplementedError

    def score_projected(self, projected_query: Tensor, projected_keys: Tensor) -> Tensor:
        """Scores ``(B, H, T_dec, T_enc)`` from ``split_query``'s output and ``project_keys``'s (or
        ``scoring_keys``' part of it)."""
        raise NotImplementedError

    def scoring_keys(self, projected_keys: Tensor) -> Tensor:
        """The part of ``project_keys``' output that ``score_projected`` reads, which it also takes in place
        of the whole: taken once before a loop that scores step by step under autograd, where a part taken
        at every step would backward into a zero buffer of the whole at every step. All of it by default."""
        return projected_keys

    def project_query(self, query: Tensor) -> Tensor:
        """Query ``(B, T_dec, d_q)`` in the scorer's comparison space: ``(B, H or 1, T_dec, d_p)``."""
        weight = self.query_weight()
        if weight is not None:
            query = query @ weight.T  # (B, T_dec, d_p·H)
        return self.split_query(query)

    def score(self, query: Tensor, projected_keys: Tensor) -> Tensor:
        """Scores ``(B, H, T_dec, T_enc)`` of query ``(B, T_dec, d_q)`` against every key."""
        return self.score_projected(self.project_query(query), projected_keys)

    # -- shared ---------------------------------------------------------------------------
    def split_heads(self, keys: Tensor) -> Tensor:
        """``(B, T, d_k)`` → ``(B, H, T, d_k / H)``: head h owns the h-th slice of the keys."""
        batch, length, _ = keys.shape
        return keys.view(batch, length, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, d_h)

    def forward(
        self,
        query: Tensor,
        keys: Tensor,
        valid_mask: Tensor,
        projected_keys: Tensor | None = None,
        step: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``step``: the index t of the target token the (first) query is for; read by local-m
        attention only (``reads_step``), the queries of a ``(B, T_dec, d_q)`` call being t, t+1, …"""
        self.check_shapes(query, keys, valid_mask)
        one_step = query.dim() == 2
        if one_step:
            query = query.unsqueeze(1)  # (B, 1, d_q)
        if projected_keys is None:
            projected_keys = self.project_keys(keys)  # (B, H, T_enc, d_p)
        scores = self.score(query, projected_keys)  # (B, H, T_dec, T_enc)
        weights = self.weigh(scores, valid_mask, query, step)  # (B, H, T_dec, T_enc)
        context = self.average(weights, keys, projected_keys)  # (B, T_dec, d_k)
        if one_step:
            return context.squeeze(1), weights.squeeze(2)  # (B, d_k), (B, H, T_enc)
        return context, weights

    def weigh(self, scores: Tensor, valid_mask: Tensor, query: Tensor, step: int | None = None) -> Tensor:
        """Scores ``(B, H, T_dec, T_enc)`` of queries ``(B, T_dec, d_q)`` → weights, same shape: the softmax
        over the valid positions, or over the local window's (``window``)."""
        if self.window is None:
            return masked_softmax(scores, valid_mask[:, None, None, :])  # (B, H, T_dec, T_enc)
        return self.window.weights(scores, valid_mask, query, step)  # (B, H, T_dec, T_enc)

    @property
    def fuses(self) -> bool:
        """Whether a fused decoder loop, which calls the scorer's parts and takes a softmax over every
        valid position itself, computes what ``forward`` does: the window's declared ``fuses`` if any."""
        return self.window is None or self.window.fuses

    @property
    def reads_step(self) -> bool:
        """Whether ``forward`` needs ``step`` (local-m's p_t = t): the window's declared ``reads_step``."""
        return self.window is not None and self.window.reads_step

    def average(self, weights: Tensor, keys: Tensor, projected_keys: Tensor) -> Tensor:
        """Weights ``(B, H, T_dec, T_enc)`` × values (here the keys themselves) → context ``(B, T_dec, d_k)``,
        heads concatenated. ``projected_keys`` is ``project_keys(keys)``, for a scorer whose values are
        projected with its keys."""
        context = weights @ self.split_heads(keys)  # (B, H, T_dec, d_h)
        batch, _, steps, _ = context.shape
        return context.transpose(1, 2).reshape(batch, steps, self.key_dim)  # (B, T_dec, d_k)

    def values_through(self, keys: Tensor, weight: Tensor) -> Tensor:
        """Each head's values already multiplied by its column block of ``weight (d_out, d_k)``:
        ``(B, H, T_enc, d_out)``, so that ``Σ_h (weights_h @ this_h)`` is ``context @ weight.T``.

        A decoder that only needs ``W c_t`` of a context at each step gets it from the weights in
        one product per step, the values projected once per batch.
        """
        blocks = weight.reshape(weight.shape[0], self.heads, self.head_dim)  # (d_out, H, d_h)
        return torch.einsum("bhtd,ohd->bhto", self.split_heads(keys), blocks)  # (B, H, T_enc, d_out)

    def check_shapes(self, query: Tensor, keys: Tensor, valid_mask: Tensor) -> None:
        d_q, d_k, name = self.query_dim, self.key_dim, self.name
        if keys.dim() != 3 or keys.shape[-1] != d_k:
            raise ShapeError(
                "keys",
                keys.shape,
                f"(B, T_enc, d_k={d_k})",
                f"pass the encoder states batch-first; this {name} attention was built with "
                f"key_dim={d_k}.",
            )
        batch, t_enc, _ = keys.shape
        if query.dim() not in (2, 3) or query.shape[0] != batch or query.shape[-1] != d_q:
            raise ShapeError(
                "query",
                query.shape,
                f"(B={batch}, d_q={d_q}) for one step or (B={batch}, T_dec, d_q={d_q}) for all steps",
                f"pass the decoder state batch-first; this {name} attention was built with "
                f"query_dim={d_q}.",
            )
        if valid_mask.shape != (batch, t_enc):
            raise ShapeError(
                "valid_mask",
                valid_mask.shape,
                f"(B={batch}, T_enc={t_enc}), matching keys {tuple(keys.shape)}",
                "build it from the source lengths with lengths_to_valid_mask(src_lengths, T_enc).",
            )
        if valid_mask.dtype != torch.bool:
            raise ShapeError(
                "valid_mask",
                valid_mask.shape,
                f"a bool tensor (True at real tokens), not {valid_mask.dtype}",
                "pass valid_mask.bool(); True marks real tokens, False padding.",
            )

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}, heads={self.heads}"


def _settings_of(cls: type[Attention]) -> type[ScorerSettings]:
    """The scorer's settings model, registered under its name: its own ``Settings``, the one
    ``attnseq.attention.settings`` holds for a built-in scorer, or one made for it here."""
    own = vars(cls).get("Settings")
    known = ScorerSettings.registry.get(cls.name)
    if own is None and known is not None:
        return known
    if own is not None and own.choice_name() == cls.name:
        return own
    base = own or cls.Settings  # a subclass without settings of its own has its parent's
    made = create_model(f"{cls.__name__}Settings", __base__=base, __module__=cls.__module__,
                        name=(Literal[cls.name], cls.name))
    if "same_size" in vars(cls):
        made.same_size = cls.same_size
    return made
