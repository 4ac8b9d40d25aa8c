"""The schema of ``conf/train.yaml`` and its groups: every key checked before any data, store or
run exists (``check_config``, called first by ``attnseq.training.build.validate``).

In order: each group is a mapping; every key of ``TRAIN_SCHEMA`` has a value of the right kind and
range; the keys handed on as keyword arguments (``dataset.*`` to the data module, ``trainer.*`` to
``lightning.Trainer``, ``optimizer.*``/``scheduler.*`` to the classes their ``_target_`` names) are
arguments those take, with values their annotations allow; ``checkpoint.monitor`` and
``optimized_metric`` are metrics the LightningModule logs; and one batch of the longest sequences
fits in memory. The scorer's own settings (``scorer.*`` besides ``name``) are checked by its class
(``ModelConfig.validate``), the combinations of sizes likewise.

Keys a user adds with ``+`` outside those groups (``+db_password=…``, ``+tracking.api_token=…``)
are allowed: nothing reads them but the run's params (redacted) and saved config; one that is a
near-miss of a key the group has (``+model.dropuot=0.1``) is taken for the typo it is.
"""

from __future__ import annotations

import difflib
import importlib
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from omegaconf import DictConfig, OmegaConf

from attnseq.attention import NO_ATTENTION
from attnseq.config import (
    Check,
    absent_ok,
    check_arguments,
    check_groups,
    check_table,
    closest,
    flag,
    length_range,
    number,
    one_of,
    optional,
    shown,
    text,
    texts,
    value_at,
    whole,
)
from attnseq.config.schema import is_whole
from attnseq.data.tokenizers import TOKENIZERS
from attnseq.errors import ConfigError
from attnseq.metrics import lower_is_better
from attnseq.model.config import CELLS, DECODERS
from attnseq.training.metric_names import logged_metrics

SYMBOL_TASKS = ("copy", "reverse", "sort")
ALL_TASKS = (*SYMBOL_TASKS, "translate", "tsv")


def _count_or_fraction(example: Any) -> Check:
    return Check(
        "a whole number of batches ≥ 0 or a fraction in [0, 1]",
        lambda v: (is_whole(v) and v >= 0) or (isinstance(v, float) and 0.0 <= v <= 1.0),
        example,
    )


TRAIN_SCHEMA: dict[str, Check] = {
    # top level
    "seed": whole(0, 2**32 - 1, example=0),
    "resume": optional(text(example="<run id>")),
    "resume_force": flag(example=False),
    "heartbeat.every_s": number(0, example=30),  # 0: at every batch end
    "heartbeat.stale_after_s": number(0, above=True, example=180),
    "threads": optional(whole(1, example=1)),
    "plugins": texts(example=["my_scorers"]),
    "optimized_metric": text(example="val/acc_best"),  # and a metric the module logs: check_metrics
    # model (the scorer's settings: its class; sizes that must agree: ModelConfig.validate)
    "model.embedding_dim": whole(1, example=64),
    "model.hidden_size": whole(1, example=128),
    "model.layers": whole(1, example=1),
    "model.dropout": number(0, 1, below=True, example=0.1),
    "model.heads": whole(1, example=1),
    "encoder.name": text(example="gru"),
    "encoder.cell": one_of(CELLS),
    "encoder.bidirectional": flag(example=False),
    "encoder.kind": absent_ok(text(example="transformer")),  # a registered kind: ModelConfig.validate
    "encoder.layers": absent_ok(whole(1, example=2)),  # encoder=transformer: self-attention layers
    "encoder.heads": absent_ok(whole(1, example=4)),  # self-attention heads; must divide model.hidden_size
    "encoder.ff_dim": absent_ok(whole(1, example=256)),
    "scorer.name": text(example="additive"),  # a registered scorer or none: ModelConfig.validate
    "decoder.convention": one_of(DECODERS),
    "decoder.input_feeding": absent_ok(optional(flag(example=True))),
    # optimisation (the other optimizer.*/scheduler.* keys: the class's own arguments, check_optimization)
    "optimizer._target_": text(example="torch.optim.Adam"),
    "optimizer._partial_": Check("true (the model's parameters are passed later)", lambda v: v is True, True),
    "optimizer.lr": absent_ok(number(0, above=True, example=0.003)),
    "scheduler._target_": absent_ok(text(example="torch.optim.lr_scheduler.ExponentialLR")),
    "scheduler._partial_": absent_ok(
        Check("true (the optimizer is passed later)", lambda v: v is True, True)
    ),
    "scheduler.gamma": absent_ok(number(0, above=True, example=0.6)),  # above 1 the rate grows
    "training.teacher_forcing": number(0, 1, example=1.0),
    "training.test_after_fit": flag(example=False),
    "training.stop_at": absent_ok(optional(number(example=0.95))),  # a value of checkpoint.monitor
    "decode.max_length_ratio": number(0, above=True, example=1.5),
    "decode.max_length_extra": whole(0, example=5),
    "checkpoint.monitor": text(example="val/exact_match"),  # and a metric the module logs: check_metrics
    "checkpoint.mode": one_of(("max", "min")),
    "tracking.heatmap_samples": whole(0, example=3),
    "tracking.heatmap_every_n_epochs": whole(1, example=1),
    "mlflow.tracking_uri": text(example="sqlite:///mlflow.db"),  # and reachable: check_tracking_uri
    "mlflow.experiment_name": text(example="attnseq"),
    "mlflow.run_name": optional(text(example="my-run")),
    "mlflow.retry_budget_s": number(0, above=True, example=30),
    "paths.output_dir": text(example="outputs/my-run"),
    # dataset (also the data module's arguments: check_arguments; the TSV file: the data module)
    "dataset.task": one_of(ALL_TASKS),
    "dataset.num_symbols": absent_ok(whole(1, example=10)),
    "dataset.path": absent_ok(text(example="/abs/path/pairs.tsv")),  # a file, or a folder of train/val/test.tsv
    "dataset.tokenizer": absent_ok(one_of(TOKENIZERS)),
    "dataset.vocab_size": absent_ok(whole(1, example=2000)),  # and holds every character: SubwordTokenizer.train
    "dataset.lowercase": absent_ok(flag()),
    "dataset.train_lengths": length_range(example=[1, 15]),  # and fits in memory: check_memory
    "dataset.eval_lengths": length_range(example=[1, 30]),
    "dataset.bucket_width": whole(1, example=5),
    "dataset.train_size": whole(1, example=12800),
    "dataset.val_size": whole(1, example=1000),
    "dataset.test_size": whole(1, example=1000),
    "dataset.batch_size": whole(1, example=64),
    "dataset.length_bucketing": flag(),
    "dataset.num_workers": whole(0, example=0),
    # trainer: any argument of lightning.Trainer (check_trainer); these also need a sensible range
    "trainer.max_epochs": absent_ok(whole(1, example=5)),
    "trainer.min_epochs": absent_ok(optional(whole(0, example=1))),
    "trainer.max_steps": absent_ok(
        Check("a whole number ≥ 1, or -1 (no limit)", lambda v: is_whole(v) and (v == -1 or v >= 1), -1)
    ),
    "trainer.log_every_n_steps": absent_ok(whole(1, example=50)),
    "trainer.check_val_every_n_epoch": absent_ok(optional(whole(1, example=1))),
    "trainer.accumulate_grad_batches": absent_ok(whole(1, example=1)),
    "trainer.gradient_clip_val": absent_ok(optional(number(0, example=1.0))),
    "trainer.num_sanity_val_steps": absent_ok(
        Check("a whole number ≥ 0, or -1 (all batches)", lambda v: is_whole(v) and v >= -1, 2)
    ),
    "trainer.fast_dev_run": absent_ok(
        Check("true, false or a whole number of batches ≥ 1", lambda v: isinstance(v, bool) or (is_whole(v) and v >= 1),
              True)
    ),
    "trainer.overfit_batches": absent_ok(_count_or_fraction(4)),
    "trainer.limit_train_batches": absent_ok(optional(_count_or_fraction(1.0))),
    "trainer.limit_val_batches": absent_ok(optional(_count_or_fraction(1.0))),
    "trainer.limit_test_batches": absent_ok(optional(_count_or_fraction(1.0))),
}
"""Every key of ``conf/train.yaml`` and its groups, with what its value must be."""

GROUPS = ("model", "encoder", "scorer", "decoder", "optimizer", "training", "decode", "checkpoint", "tracking",
          "heartbeat", "mlflow", "paths", "dataset", "trainer")
"""The keys that hold a mapping of settings (``scheduler`` too, or null)."""

PASSED_ON = ("dataset", "trainer", "optimizer", "scheduler", "scorer")
"""Groups whose keys are handed on as arguments (checked against the receiver, not for near-misses)."""

SET_BY_ATTNSEQ = {
    "logger": "the MLflow logger",
    "callbacks": "the checkpoint, artifact and guard callbacks",
    "default_root_dir": "paths.output_dir",
}
"""``lightning.Trainer`` arguments the training pipeline passes itself."""


def check_config(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` naming the first key whose value cannot work, what it must be, and the fix."""
    check_groups(cfg, GROUPS)
    if cfg.get("scheduler") is not None and not isinstance(cfg.scheduler, DictConfig):
        check_groups(cfg, ["scheduler"])
    check_table(cfg, TRAIN_SCHEMA)
    check_added_keys(cfg)
    check_dataset_arguments(cfg)
    check_trainer(cfg)
    check_optimization(cfg)
    check_metrics(cfg)
    check_memory(cfg)


def check_added_keys(cfg: DictConfig) -> None:
    """A key added with ``+`` to a group attnseq reads is allowed (nothing reads it but the run's params),
    unless it is a near-miss of one the group has: ``+model.dropuot=0.1`` would silently change nothing."""
    for group in GROUPS:
        if group in PASSED_ON or not isinstance(cfg.get(group), DictConfig):
            continue
        known = [key.split(".", 1)[1] for key in TRAIN_SCHEMA if key.startswith(f"{group}.")]
        for name in cfg[group]:
            if name in known:
                continue
            match = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
            if match:
                raise ConfigError(
                    f"{group}.{name} is not read by attnseq. Did you mean {group}.{match[0]}?",
                    f"use {group}.{match[0]}=<value> (without +), and drop {group}.{name}.",
                )


# -- arguments handed on ------------------------------------------------------------------------


def check_dataset_arguments(cfg: DictConfig) -> None:
    from attnseq.data.datamodule import Seq2SeqDataModule

    check_arguments("dataset", value_at(cfg, "dataset"), Seq2SeqDataModule.__init__,
                    "the data module (attnseq.data.Seq2SeqDataModule)", skip=("seed",))


def check_trainer(cfg: DictConfig) -> None:
    import lightning as L

    values = value_at(cfg, "trainer")
    for name, passed_as in SET_BY_ATTNSEQ.items():
        if name in values:
            raise ConfigError(
                f"trainer.{name} is set by attnseq itself ({passed_as}).",
                f"drop it (on the command line: ~trainer.{name}).",
            )
    check_arguments("trainer", values, L.Trainer.__init__, "lightning.Trainer", skip=SET_BY_ATTNSEQ)


def check_optimization(cfg: DictConfig) -> None:
    """``optimizer._target_`` an optimizer class, ``scheduler._target_`` a scheduler class, each
    given only arguments it takes."""
    optimizer = locate("optimizer._target_", cfg.optimizer._target_, torch.optim, torch.optim.Optimizer)
    check_arguments("optimizer", value_at(cfg, "optimizer"), optimizer.__init__, cfg.optimizer._target_,
                    skip=("params",))
    if cfg.get("scheduler") is None:
        return
    if "_target_" not in cfg.scheduler:
        raise ConfigError("scheduler has no _target_.",
                          "set scheduler._target_=torch.optim.lr_scheduler.ExponentialLR, or scheduler=null.")
    schedulers = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    scheduler = locate("scheduler._target_", cfg.scheduler._target_, torch.optim.lr_scheduler, schedulers)
    check_arguments("scheduler", value_at(cfg, "scheduler"), scheduler.__init__, cfg.scheduler._target_,
                    skip=("optimizer",))


def locate(key: str, path: str, home: Any, base: type | tuple[type, ...]) -> type:
    """The class a ``_target_`` names; a typo gets the closest name in its module (or in ``home``)."""
    module_name, _, name = path.rpartition(".")
    module = None
    if module_name:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = None
    found = getattr(module, name, None) if module is not None else None
    kind = "an optimizer class" if home is torch.optim else "a learning-rate scheduler class"
    if not (isinstance(found, type) and issubclass(found, base)):
        search = module if module is not None and _classes(module, base) else home
        names = _classes(search, base)
        match = closest(name, names)
        problem = (f"{key}={path} cannot be imported" if found is None
                   else f"{key}={path} is not {kind} (a subclass of {_qualified(base)})")
        raise ConfigError(
            f"{problem}.{f' Did you mean {search.__name__}.{match}?' if match else ''}",
            f"set {key} to {kind}, e.g. {key}={search.__name__}.{match or names[0]} "
            f"({search.__name__} has: {', '.join(names)}).",
        )
    return found


def _classes(module: Any, base: type | tuple[type, ...]) -> list[str]:
    """The public subclasses of ``base`` a module holds (the abstract bases themselves left out)."""
    bases = base if isinstance(base, tuple) else (base,)
    return sorted(name for name, value in vars(module).items()
                  if isinstance(value, type) and issubclass(value, base) and value not in bases
                  and not name.startswith("_"))


def _qualified(base: type | tuple[type, ...]) -> str:
    bases = base if isinstance(base, tuple) else (base,)
    return " or ".join(f"{b.__module__}.{b.__qualname__}" for b in bases)


def check_schedule(optimizer: torch.optim.Optimizer, make_scheduler: Callable | None, epochs: int) -> None:
    """The learning rate every epoch of the schedule gives is finite and positive (``optimizer.lr=inf``,
    ``scheduler.gamma=-1`` are not)."""
    scheduler = make_scheduler(optimizer) if make_scheduler is not None else None
    for epoch in range(max(1, min(epochs, 1000))):
        for group in optimizer.param_groups:
            lr = float(group["lr"])
            if not math.isfinite(lr) or lr <= 0:
                raise ConfigError(
                    f"the learning rate in epoch {epoch} would be {lr} (optimizer.lr="
                    f"{shown(optimizer.defaults['lr'])}, scheduler "
                    f"{type(scheduler).__name__ if scheduler else 'none'}): it must stay finite and > 0.",
                    "set optimizer.lr to a finite number > 0, e.g. optimizer.lr=0.003, and a scheduler that "
                    "keeps it positive and finite (e.g. scheduler.gamma=0.6) or scheduler=null.",
                )
        if scheduler is None or isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            return
        optimizer.step()
        scheduler.step()


# -- metrics ---------------------------------------------------------------------------------------


def check_metrics(cfg: DictConfig) -> None:
    """``checkpoint.monitor`` is a metric logged during fit, with a ``checkpoint.mode`` that keeps the
    best of it; ``optimized_metric`` one logged by the end (test metrics too with test_after_fit)."""
    during_fit = logged_metrics(cfg)
    by_end = during_fit + (logged_metrics(cfg, "test")[:-2] if cfg.training.test_after_fit else [])
    for key, valid in (("checkpoint.monitor", during_fit), ("optimized_metric", by_end)):
        metric = value_at(cfg, key)
        if metric not in valid:
            match = closest(metric, valid)
            buckets = [m for m in valid if "_len/" in m]
            listed = [m for m in valid if "_len/" not in m]
            raise ConfigError(
                f"{key}={shown(metric)} is not a metric this run logs.{f' Did you mean {match}?' if match else ''}",
                f"set {key} to one of {', '.join(listed)}, or a length bucket "
                f"({buckets[0]} … {buckets[-1]}), e.g. {key}={match or listed[0]}.",
            )
    monitor, mode = cfg.checkpoint.monitor, cfg.checkpoint.mode
    wanted = "min" if lower_is_better(monitor) else "max"
    if mode != wanted:
        raise ConfigError(
            f"checkpoint.mode={mode} with checkpoint.monitor={monitor} keeps the worst checkpoint as 'best': "
            f"{monitor} is better when {'lower' if wanted == 'min' else 'higher'}.",
            f"set checkpoint.mode={wanted}.",
        )


# -- memory -------------------------------------------------------------------------------------------

BYTES_PER_DATA_TOKEN = 48
"""A lower bound on the memory one token of synthetic data takes: a list slot (8 bytes) in the
source, target and alignment of both the ``Example`` and the ``EncodedExample``."""


class Need(NamedTuple):
    """A lower bound on the memory one side of training takes, and the key whose value sets it."""

    key: str
    data: int  # the generated examples, in host memory
    batch: int  # one batch of the longest sequences, on the accelerator
    why: str


def memory_needs(cfg: DictConfig, train_hi: int | None = None, eval_hi: int | None = None) -> list[Need]:
    """Lower bounds, in bytes, on what the training split and the evaluation splits take: the
    generated examples, and one batch of the longest sequences' attention weights,
    (B, heads, T_dec, T_enc) float32 (kept for the backward pass in training; for every greedy
    decoding step in validation). Deliberately low: a config it rejects cannot fit."""
    ds = cfg.dataset
    train_hi = int(ds.train_lengths[1]) if train_hi is None else train_hi
    eval_hi = int(ds.eval_lengths[1]) if eval_hi is None else eval_hi
    batch = int(ds.batch_size)
    heads = int(cfg.model.heads) if cfg.scorer.name != NO_ATTENTION else 0
    decoded = int(eval_hi * float(cfg.decode.max_length_ratio)) + int(cfg.decode.max_length_extra)

    def data(size: int, lo: int, hi: int) -> int:
        return 0 if ds.task == "tsv" else int(size * (lo + hi) / 2 * BYTES_PER_DATA_TOKEN)

    evaluated = int(ds.val_size) + int(ds.test_size)
    return [
        Need("dataset.train_lengths", data(int(ds.train_size), int(ds.train_lengths[0]), train_hi),
             4 * batch * heads * (train_hi + 1) * train_hi,
             f"{int(ds.train_size)} training examples and a batch of {batch} sources of {train_hi} tokens"),
        Need("dataset.eval_lengths", data(evaluated, int(ds.eval_lengths[0]), eval_hi),
             4 * batch * heads * max(decoded, eval_hi + 1) * eval_hi,
             f"{evaluated} validation and test examples and a batch of {batch} sources of {eval_hi} tokens "
             f"decoded up to {decoded} steps"),
    ]


class Budget(NamedTuple):
    """The memory there is: the host's, and the accelerator's (None: batches live in host memory too)."""

    host: int
    device: int | None = None

    def holds(self, need: Need) -> bool:
        if self.device is None:
            return need.data + need.batch <= self.host
        return need.data <= self.host and need.batch <= self.device

    def __str__(self) -> str:
        device = f" and {_size(self.device)} of accelerator memory" if self.device is not None else ""
        return f"this machine's {_size(self.host)} of memory{device}"


def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def memory_budget(cfg: DictConfig) -> Budget | None:
    host = physical_memory()
    if not host:
        return None
    on_gpu = str(cfg.trainer.get("accelerator", "cpu")) in ("gpu", "cuda") and torch.cuda.is_available()
    return Budget(host, torch.cuda.get_device_properties(0).total_memory if on_gpu else None)


def check_memory(cfg: DictConfig, budget: Budget | None = None) -> None:
    """Reject lengths (with this batch size and heads) that cannot fit in this machine's memory,
    before minutes of data generation end in a failed allocation."""
    budget = memory_budget(cfg) if budget is None else budget
    if budget is None:
        return
    for index, need in enumerate(memory_needs(cfg)):
        if budget.holds(need):
            continue
        lengths = list(value_at(cfg, need.key))
        longest = _longest_that_fits(cfg, index, budget, lengths[0], lengths[1])
        sizes = "dataset.train_size" if index == 0 else "dataset.val_size / dataset.test_size"
        fix = (f"lower the longest length, e.g. {need.key}=[{lengths[0]}, {longest}] (about the most that "
               f"fits), or lower dataset.batch_size / {sizes}" if longest else f"lower dataset.batch_size and {sizes}")
        raise ConfigError(
            f"{need.key}={shown(lengths)} needs at least {_size(need.data + need.batch)} of memory ({need.why}), "
            f"more than {budget}.",
            fix + ".",
        )


def _longest_that_fits(cfg: DictConfig, index: int, budget: Budget, lo: int, hi: int) -> int | None:
    def holds(longest: int) -> bool:
        lengths = {"train_hi": longest} if index == 0 else {"eval_hi": longest}
        return budget.holds(memory_needs(cfg, **lengths)[index])

    if not holds(lo):
        return None
    while lo < hi:
        middle = (lo + hi + 1) // 2
        lo, hi = (middle, hi) if holds(middle) else (lo, middle - 1)
    return lo


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{count} B"
        count /= 1000
    return f"{count} B"


def config_keys(cfg: DictConfig) -> list[str]:
    """Every leaf key of a composed config, dotted (what the schema must cover)."""
    container = OmegaConf.to_container(cfg, resolve=False)

    def walk(node: Any, prefix: str) -> list[str]:
        if isinstance(node, dict) and node:
            return [k for key, value in node.items() for k in walk(value, f"{prefix}{key}.")]
        return [prefix[:-1]]

    return walk(container, "")
