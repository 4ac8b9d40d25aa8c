"""What the benchmark trains: its cases (encoder × scorer × decoder, as conf/ composes them), the
variants it tries against some of them, and its settings.

The scorers come from the scorer registry (``attnseq.attention.SCORERS``) and the encoders from
conf/encoder/; a combination is a case when the model config accepts it (``ModelConfig.validate``:
for instance a same-size scorer needs keys as wide as the query, so not with a bidirectional
encoder). A new scorer is benchmarked without editing this file.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from attnseq.attention import NO_ATTENTION, SCORERS
from attnseq.config import validate_train
from attnseq.errors import ConfigError
from attnseq.kernels import DEFAULT_FAST_PATHS, FastPaths
from attnseq.model.conventions import DECODER_CONVENTIONS
from attnseq.training.build import model_config

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"

DECODERS: dict[str, tuple[str, ...]] = {
    case: overrides for convention in DECODER_CONVENTIONS.values() for case, overrides in convention.cases().items()
}
"""The decoder variants a case names, with the overrides that select them (from the registered
conventions: ``attnseq.model.conventions``)."""


@dataclass(frozen=True)
class Case:
    encoder: str  # an option of conf/encoder
    scorer: str  # a registered scorer, or NO_ATTENTION
    decoder: str = "bahdanau"  # a key of DECODERS

    @property
    def name(self) -> str:
        return f"{self.encoder}/{self.scorer}/{self.decoder}"

    def overrides(self) -> list[str]:
        return [f"encoder={self.encoder}", f"scorer={self.scorer}", *DECODERS[self.decoder]]


# The cases the targets name (benchmarks/results.md, "Targets").
KEY_ADDITIVE = Case("gru", "additive", "bahdanau")
KEY_DOT = Case("gru", "dot", "luong-nofeed")
KEY_GENERAL = Case("gru", "general", "luong-nofeed")
TRANSFORMER = Case("transformer", "multihead", "transformer")
"""The encoder–decoder Transformer that ``transformer_reference`` sets beside ``nn.Transformer``."""


@dataclass(frozen=True)
class Variant:
    """Something tried against a case, measured in lock step with it and the baseline.

    ``loop="minimal"``: one more minimal loop in the case's own trainer run, over a model built
    with ``fast_paths`` and a config with ``overrides``. ``loop="real"``: a trainer run of its own
    (the real path) with ``overrides``; its minimal loop is the case's as it is.
    """

    case: Case
    what: str
    loop: str
    fast_paths: FastPaths = DEFAULT_FAST_PATHS
    overrides: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.case.name} ({self.what})"


STEP_BY_STEP = FastPaths(fused_decoder=False)  # the decoder loop that decoding runs
AUTOGRAD_GRU = FastPaths(gru_sequence=False)  # torch.gru under autograd instead of the hand-written backward
HAND_WRITTEN_LSTM = FastPaths(lstm_sequence=True)  # the whole-sequence LSTM kernel, off by default
PACKED_LSTM = FastPaths(lstm_by_length=False)  # the LSTM encoder over packed sequences, not once per distinct length
AUTOGRAD_ADDITIVE = FastPaths(additive_all_steps=False)  # the all-steps additive score under autograd, not the kernel
AUTOGRAD_MULTIPLICATIVE = FastPaths(multiplicative_recurrence=False)  # dot/general: Bahdanau, Luong's input feeding
NO_FAST_PATHS = FastPaths(**{switch.name: False for switch in fields(FastPaths)})
"""The model as it is written: the decoder stepped one token at a time, torch's GRU and LSTM under autograd."""
WITHOUT_FAST_PATHS = "every fast path off"

SLOW_FAMILIES_GOAL = 1.8
"""The real path's ×base the LSTM cases and biGRU + Luong + additive/concat aim at, like the GRU ones (issue 28)."""

SLOW_FAMILIES: dict[str, Callable[[Case], bool]] = {
    "LSTM encoder and decoder, every scorer and convention": lambda case: case.encoder == "lstm",
    "biGRU + Luong + additive/concat": lambda case: case.encoder == "bigru" and case.scorer in ("additive", "concat")
    and case.decoder.startswith("luong"),
}
"""The families short of the GRU cases' speed, by name: each case of them also runs its model with every fast
path off (``NO_FAST_PATHS``), in lock step, so the report can say what reaching the goal would take."""


def in_slow_family(case: Case) -> bool:
    return any(member(case) for member in SLOW_FAMILIES.values())


def without_fast_paths(case: Case) -> Variant:
    """The case's model with every fast path off, one more minimal loop in the case's trainer run."""
    return Variant(case, WITHOUT_FAST_PATHS, "minimal", fast_paths=NO_FAST_PATHS)


VARIANTS = [
    Variant(KEY_ADDITIVE, "step-by-step decoder loop", "minimal", fast_paths=STEP_BY_STEP),
    Variant(Case("gru", "additive", "luong"), "step-by-step decoder loop", "minimal", fast_paths=STEP_BY_STEP),
    Variant(Case("lstm", "additive", "bahdanau"), "step-by-step decoder loop", "minimal", fast_paths=STEP_BY_STEP),
    *(Variant(Case(encoder, "multihead", "bahdanau"), "step-by-step decoder loop", "minimal", fast_paths=STEP_BY_STEP)
      for encoder in ("gru", "lstm", "bigru")),
    Variant(KEY_DOT, "nn.GRU's autograd backward", "minimal", fast_paths=AUTOGRAD_GRU),
    Variant(KEY_ADDITIVE, "Adam's default step, not fused", "minimal", overrides=("+optimizer.fused=false",)),
    Variant(KEY_DOT, "Adam's default step, not fused", "minimal", overrides=("+optimizer.fused=false",)),
    Variant(Case("gru", NO_ATTENTION), "nn.GRU's autograd backward", "minimal", fast_paths=AUTOGRAD_GRU),
    Variant(Case("lstm", "dot", "luong-nofeed"), "hand-written LSTM backward", "minimal", fast_paths=HAND_WRITTEN_LSTM),
    Variant(Case("lstm", "additive", "luong"), "hand-written LSTM backward", "minimal", fast_paths=HAND_WRITTEN_LSTM),
    *(Variant(Case("lstm", scorer, decoder), "packed LSTM encoder", "minimal", fast_paths=PACKED_LSTM)
      for scorer, decoder in (("dot", "luong-nofeed"), ("general", "luong"), ("additive", "bahdanau"),
                              ("dot", "transformer"))),
    Variant(Case("gru", "additive", "luong-nofeed"), "all-steps score under autograd", "minimal",
            fast_paths=AUTOGRAD_ADDITIVE),
    Variant(Case("bigru", "additive", "luong-nofeed"), "all-steps score under autograd", "minimal",
            fast_paths=AUTOGRAD_ADDITIVE),
    Variant(Case("bigru", "concat", "luong-nofeed"), "all-steps score under autograd", "minimal",
            fast_paths=AUTOGRAD_ADDITIVE),
    Variant(Case("lstm", "additive", "transformer"), "all-steps score under autograd", "minimal",
            fast_paths=AUTOGRAD_ADDITIVE),
    Variant(Case("lstm", "concat", "transformer"), "all-steps score under autograd", "minimal",
            fast_paths=AUTOGRAD_ADDITIVE),
    Variant(Case("gru", "general", "luong"), "multiplicative recurrence under autograd", "minimal",
            fast_paths=AUTOGRAD_MULTIPLICATIVE),
    Variant(Case("lstm", "general", "luong"), "multiplicative recurrence under autograd", "minimal",
            fast_paths=AUTOGRAD_MULTIPLICATIVE),
    Variant(Case("lstm", "dot", "luong"), "multiplicative recurrence under autograd", "minimal",
            fast_paths=AUTOGRAD_MULTIPLICATIVE),
    *(Variant(Case(encoder, scorer, "bahdanau"), "multiplicative recurrence under autograd", "minimal",
              fast_paths=AUTOGRAD_MULTIPLICATIVE)
      for encoder, scorer in (("gru", "dot"), ("gru", "general"), ("lstm", "dot"), ("lstm", "scaled_dot"),
                              ("lstm", "general"), ("bigru", "general"), ("bilstm", "general"))),
    Variant(KEY_ADDITIVE, "progress bar off", "real", overrides=("trainer.enable_progress_bar=false",)),
    Variant(KEY_ADDITIVE, "1 DataLoader worker", "real", overrides=("dataset.num_workers=1",)),
]
"""The ablations of the full run (those whose case is measured)."""


def compose_case(case: Case, overrides: Iterable[str] = ()) -> DictConfig:
    """conf/train.yaml composed for ``case``, then ``overrides``."""
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("train", overrides=[*case.overrides(), *overrides])


@functools.cache
def composed(case: Case) -> DictConfig:
    """``compose_case(case)``, composed once per process and read-only (Hydra's composition is most of
    what checking every case costs)."""
    cfg = compose_case(case)
    OmegaConf.set_readonly(cfg, True)
    return cfg


@functools.cache
def is_valid(case: Case) -> bool:
    """Whether the model config accepts the case (the check train.py runs before training)."""
    return accepts(composed(case))


def accepts(cfg: DictConfig) -> bool:
    """Whether the model config accepts a composed config (``ModelConfig.validate``)."""
    try:
        model_config(validate_train(cfg), src_vocab_size=1, tgt_vocab_size=1).validate()
    except ConfigError:
        return False
    return True


def encoders() -> list[str]:
    """The options of conf/encoder/, unidirectional ones first."""
    names = sorted(path.stem for path in (CONF / "encoder").glob("*.yaml"))
    return sorted(names, key=lambda name: bool(OmegaConf.load(CONF / "encoder" / f"{name}.yaml").bidirectional))


def scorers() -> list[str]:
    """Every registered scorer, then the no-attention baseline."""
    return [*SCORERS, NO_ATTENTION]


def all_cases() -> list[Case]:
    """scorer × decoder × encoder, less what the config rejects and what does not exist (a query
    convention without attention: one no-attention case per encoder)."""
    cases = []
    for encoder in encoders():
        for scorer in SCORERS:
            cases += [case for decoder in DECODERS if is_valid(case := Case(encoder, scorer, decoder))]
        cases.append(Case(encoder, NO_ATTENTION))
    return cases


def quick_cases() -> list[Case]:
    """A few cases that cover every scorer, decoder and encoder at least once: the targets' cases,
    then one case per other scorer, each on the encoder and decoder seen least so far."""
    cases = [KEY_ADDITIVE, KEY_DOT]
    seen = Counter(part for case in cases for part in (case.encoder, case.decoder))
    for scorer in scorers():
        if scorer in {case.scorer for case in cases}:
            continue
        decoders = list(DECODERS) if scorer != NO_ATTENTION else list(DECODERS)[:1]
        candidates = [Case(encoder, scorer, decoder) for encoder in encoders() for decoder in decoders]
        candidates.sort(key=lambda case: seen[case.encoder] + seen[case.decoder])  # stable: conf order on ties
        case = next(case for case in candidates if is_valid(case))
        cases.append(case)
        seen.update((case.encoder, case.decoder))
    return cases


@dataclass
class Settings:
    warmup: int
    window: int
    windows: int
    train_size: int
    decode_batches: int
    cases: list[Case]
    threads: int
    device: str
    sizes: tuple[int, int] = (64, 128)  # embedding, hidden
    compile: bool = False
    ablations: bool = True
    sections: tuple[str, ...] = ()  # waits.SECTIONS run after the training tables
    decode_repeats: int = 3  # rounds of the Transformer's decoding comparison, alternating; medians

    @property
    def steps(self) -> int:
        return self.warmup + self.window * self.windows + 1  # +1: a step's end is the next one's start

    def variants(self) -> list[Variant]:
        """What was tried on the cases (with ``ablations``), and every slow-family case without its fast paths."""
        tried = [variant for variant in VARIANTS if variant.case in self.cases] if self.ablations else []
        return tried + [without_fast_paths(case) for case in self.cases if in_slow_family(case)]


def transformer_config(settings: Settings, workdir: Path):
    """``TRANSFORMER``'s benchmark config with as many cross-attention heads (``model.heads``) as the
    decoder's self-attention has: ``nn.Transformer`` has one ``nhead`` for all its attentions."""
    heads = benchmark_config(TRANSFORMER, settings, workdir).decoder.heads
    return benchmark_config(TRANSFORMER, settings, workdir, extra=[f"model.heads={heads}"])


def benchmark_config(case: Case, settings: Settings, workdir: Path, bucketing: bool = True, extra: Iterable[str] = ()):
    """The real composed config with the benchmark's data, sizes and outputs, then ``extra``."""
    emb, hidden = settings.sizes
    return compose_case(
        case,
        [
            "dataset=copy",
            "dataset.train_lengths=[5,40]",
            "dataset.eval_lengths=[5,40]",
            f"dataset.train_size={settings.train_size}",
            "dataset.val_size=64",
            "dataset.test_size=64",
            f"dataset.length_bucketing={str(bucketing).lower()}",
            f"model.embedding_dim={emb}",
            f"model.hidden_size={hidden}",
            f"trainer.log_every_n_steps={settings.window}",
            f"paths.output_dir={workdir}/out",
            f"mlflow.tracking_uri=sqlite:///{workdir}/mlflow.db",
            "mlflow.experiment_name=benchmark",
            *extra,
        ],
    )
