"""The model's typed configuration, and the checks that reject a bad combination before any
tensor exists. Messages speak in the user's config keys (``model.heads``, ``encoder=bigru``).
Torch-free: the config is checked before torch is imported."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, create_model

Size = Annotated[int, Field(ge=1, le=2**16)]  # a 2**16 × 2**16 weight matrix is 17 GB of float32: past any memory
InitScheme = Literal["torch", "xavier"]
"""``model.init``: how the weights start (``attnseq.model.initialization.DRAWS`` holds one draw per name)."""
MAX_BEAM_SIZE = 16  # translate.py's beam_size, and the served model's max_beam_size unless its model_config says more

from attnseq.attention.settings import LOCAL_ATTENTION, NO_ATTENTION, LocalSettings, ScorerSettings, size_problems
from attnseq.errors import ConfigError
from attnseq.model.conventions import DecoderSettings
from attnseq.model.encoders import RNN, EncoderSettings
from attnseq.registry import import_plugins, require_plugins

CHOICES = {"encoder": EncoderSettings.registry, "scorer": ScorerSettings.registry,
           "decoder": DecoderSettings.registry, "attention": LOCAL_ATTENTION}
"""The model's choice groups, each a registry of settings models whose ``union()`` the config is checked with."""


class ModelGroup(BaseModel):
    """``model.*``: the sizes every encoder, scorer and decoder shares."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True, allow_inf_nan=False)
    embedding_dim: Size = Field(description="token embedding size", examples=[64])
    hidden_size: Size = Field(description="RNN state size (and the transformer encoder's width)", examples=[128])
    layers: int = Field(ge=1, le=64, description="decoder depth (and the RNN encoder's); a step runs them in turn",
                        examples=[1])
    dropout: float = Field(ge=0, lt=1, description="dropout between layers", examples=[0.1])
    heads: PositiveInt = Field(description="attention heads; must divide the key size (2 × hidden_size for bigru)",
                               examples=[1])
    tie_output: bool = Field(False, description="the output layer's weights are the target embedding's (Press & "
                             "Wolf 2017), after a projection to model.embedding_dim where the decoder's width differs")
    share_embeddings: bool = Field(False, description="one embedding reads the source and the target (the tasks "
                                   "with one vocabulary: copy, reverse, sort)")
    init: InitScheme = Field("torch", description="how the weights start: torch (each module's "
                                             "default) or xavier (JoeyNMT's: Glorot-uniform matrices, an RNN's "
                                             "gates counted apart, N(0, 0.1²) embeddings, zero biases)")


def architecture_problems(model: ModelGroup, encoder: EncoderSettings, scorer: ScorerSettings,
                          decoder: DecoderSettings, local: LocalSettings | None = None) -> list[ConfigError]:
    """What cannot work in this combination of sizes, encoder, scorer, decoder and local attention
    (every problem)."""
    found = encoder.problems(model.hidden_size) + decoder.problems() + decoder.size_problems(model.hidden_size)
    found += local.problems(scorer.name) if local is not None else []
    if scorer.name == NO_ATTENTION:
        if decoder.needs_attention:
            found.append(ConfigError(
                f"decoder={decoder.convention} reads the source through its cross-attention alone, and scorer=none "
                "has no attention.",
                "pick a scorer, e.g. scorer=multihead (the Transformer's), or another decoder, e.g. decoder=bahdanau.",
            ))
        return found
    d_k = encoder.key_dim(model.hidden_size)
    keys_come_from = (f"2 × model.hidden_size={model.hidden_size}, since the encoder is bidirectional"
                      if d_k != model.hidden_size else f"model.hidden_size={model.hidden_size}")
    sizes = size_problems(type(scorer), model.hidden_size, d_k, model.heads, keys_come_from)
    return found + (sizes or scorer.problems(model.hidden_size, d_k, model.heads))


def sharing_problem(why: str) -> ConfigError:
    """``model.share_embeddings=true`` where the source and target vocabularies differ (``why``)."""
    from attnseq.data.tasks import TASKS

    one = TASKS.names(shares_vocabulary=True)
    return ConfigError(
        f"model.share_embeddings=true, but {why}: one embedding matrix cannot read both (a row is one token of "
        "one vocabulary).",
        f"set model.share_embeddings=false (model.tie_output=true still ties the target embedding to the output "
        f"layer), or pick a task with one vocabulary: {', '.join(f'dataset={name}' for name in one)}.",
    )


def vocabulary_problems(model: ModelGroup, task: type) -> list[ConfigError]:
    """``model.share_embeddings`` with a task whose source and target vocabularies differ
    (``Task.shares_vocabulary``), known before any data exists."""
    if not model.share_embeddings or task.shares_vocabulary:
        return []
    return [sharing_problem(f"dataset={task.choice_name()} builds a vocabulary for each side")]


@dataclass(frozen=True)
class ModelConfig:
    """Everything that fixes a Seq2Seq model's architecture and parameter count (saved with the weights)."""

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
    """The encoder kind's own settings (e.g. the transformer's ``heads``)."""
    scorer: str = "additive"
    scorer_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """The scorer's own settings: ``conf/scorer/<name>.yaml`` less ``name`` (e.g. ``attn_dim``)."""
    heads: int = 1
    decoder: str = "bahdanau"
    input_feeding: bool | None = None
    """Luong only: feed h̃_{t-1} into the next step (None: on)."""
    decoder_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """The decoder convention's own settings (e.g. the transformer's ``layers``)."""
    local: str = "none"
    """Luong's local attention (``attention.local``): ``none`` (global), ``monotonic`` or ``predictive``."""
    window: int | None = None
    """Its half-width D (``attention.window``; None: 10 for a local kind)."""
    plugins: tuple[str, ...] = ()
    """Modules imported before validation, so that the choices they define are registered."""
    tie_output: bool = False
    """``model.tie_output``: the output layer's weight matrix is the target embedding (one Parameter)."""
    share_embeddings: bool = False
    """``model.share_embeddings``: the source and target embeddings are one Parameter (one vocabulary)."""
    init: InitScheme = "torch"
    """``model.init``: how the weights start (``attnseq.model.initialization``)."""

    @classmethod
    def from_config(cls, cfg: Any, src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
        """The model part of a validated ``attnseq.config.TrainConfig``, sized by the data's vocabularies."""
        return cls(src_vocab_size, tgt_vocab_size, **cfg.model.model_dump(exclude=set(cfg.model.model_extra or ())),
                   cell=cfg.encoder.cell, bidirectional=cfg.encoder.bidirectional, encoder=cfg.encoder.kind,
                   encoder_options=cfg.encoder.options, scorer=cfg.scorer.name,
                   scorer_options=cfg.scorer.model_dump(exclude={"name"}), decoder=cfg.decoder.convention,
                   input_feeding=getattr(cfg.decoder, "input_feeding", None), decoder_options=cfg.decoder.options,
                   local=cfg.attention.local,
                   window=cfg.attention.window, plugins=tuple(cfg.plugins))

    @classmethod
    def from_saved(cls, saved: Mapping[str, Any]) -> ModelConfig:
        """The config a run saved with its weights (``dataclasses.asdict``), including those saved
        before the scorer's settings moved to its own group (a top-level ``attn_dim``). Its plugins
        must be imported already, on request (``require_plugins``): a saved file never runs code."""
        fields = dict(saved)
        options = dict(fields.pop("scorer_options", None) or {})
        attn_dim = fields.pop("attn_dim", None)
        if attn_dim is not None:
            options.setdefault("attn_dim", attn_dim)
        if fields.get("decoder") == "bahdanau":
            fields["input_feeding"] = None  # saved as a meaningless True/False before
        fields["plugins"] = tuple(fields.get("plugins", ()))
        require_plugins(fields["plugins"])
        return cls(**fields, scorer_options=options)

    @property
    def feeds_input(self) -> bool:
        """Whether the decoder is Luong's with input feeding."""
        return self.parts()[3].feeds_input

    @property
    def self_attending(self) -> tuple[bool, bool]:
        """Whether the encoder and the decoder attend over their own sequence (their settings'
        ``self_attends``): what ``Seq2Seq.self_attention`` returns maps of."""
        _, encoder, _, decoder, _ = self.parts()
        return encoder.self_attends, decoder.self_attends

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

    def parts(self) -> tuple[ModelGroup, EncoderSettings, ScorerSettings, DecoderSettings, LocalSettings]:
        """The typed settings this config stands for, by the models the config is checked with
        (``ConfigError`` naming every bad value, the vocabulary sizes' included)."""
        from attnseq.problems import validated

        import_plugins(self.plugins)
        groups = {"model": ModelGroup, **{group: registry.union() for group, registry in CHOICES.items()}}
        vocabulary = (PositiveInt, Field(examples=[20]))
        model = create_model("ModelParts", __config__=ConfigDict(strict=True), src_vocab_size=vocabulary,
                             tgt_vocab_size=vocabulary, **{group: (union, ...) for group, union in groups.items()})
        parts = validated(model, {
            "model": {k: getattr(self, k) for k in ModelGroup.model_fields},
            "encoder": {**self.encoder_options, "kind": self.encoder, "cell": self.cell,
                        "bidirectional": self.bidirectional},
            "scorer": {**self.scorer_options, "name": self.scorer},
            "decoder": {**self.decoder_options, "convention": self.decoder,
                        **({} if self.input_feeding is None else {"input_feeding": self.input_feeding})},
            "attention": {"local": self.local, "window": self.window},
            "src_vocab_size": self.src_vocab_size, "tgt_vocab_size": self.tgt_vocab_size})
        return tuple(getattr(parts, group) for group in groups)

    def validate(self) -> None:
        """Raise ``ConfigError`` naming every bad value, the shapes involved and the fix."""
        from attnseq.problems import raise_all

        found = architecture_problems(*self.parts())
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            found.append(sharing_problem(f"the source vocabulary has {self.src_vocab_size} tokens and the target's "
                                         f"{self.tgt_vocab_size}"))
        raise_all(found)
