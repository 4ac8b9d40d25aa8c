"""Stage one of checking a composed config, before torch, Lightning or MLflow is imported: every key
attnseq owns and the monitored metrics, every problem at once. Stage two, the keys handed on to
those libraries, is ``attnseq.training.validation``."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import BaseModel, TypeAdapter, ValidationError

from attnseq.attention.settings import NO_ATTENTION
from attnseq.config.memory import check_memory, memory_budget
from attnseq.config.models import (
    HANDED_ON,
    KEYS_ADDED_SINCE,
    EvalConfig,
    TrainBase,
    TranslateConfig,
    train_config_model,
)
from attnseq.data.tasks import TASKS
from attnseq.errors import ConfigError
from attnseq.metrics.declarations import SCORES, SuiteSpec, lower_is_better, names
from attnseq.model.config import architecture_problems, vocabulary_problems
from attnseq.problems import override, raise_all, shown, told
from attnseq.registry import closest, did_you_mean, import_plugins

AT_RUN_TIME = "<set by Hydra at run time>"  # a ${hydra:...} value in a config composed without a Hydra run
HYDRA_CWD = "${hydra:runtime.cwd}"


def before_the_run(raw: str) -> str:
    """A ``${hydra:...}`` value read before Hydra's run: ``runtime.cwd`` is this process's working
    directory (Hydra records it as the run starts, before any change), so a corpus path built on it is
    checked as the run will read it; any other reads ``AT_RUN_TIME``."""
    known = raw.replace(HYDRA_CWD, os.getcwd())
    return AT_RUN_TIME if "${" in known else known

METRIC_KEYS = ("dataset", "scorer", "training", "checkpoint", "optimized_metric", "faith")  # what metric_problems reads


def validate_train(cfg: DictConfig) -> TrainBase:
    """The typed ``TrainConfig`` of a composed ``conf/train.yaml``, or ``ConfigError`` naming every problem."""
    return validated_config(train_config_model, cfg)


def validate_evaluate(cfg: DictConfig) -> EvalConfig:
    """The typed ``EvalConfig`` of a composed ``conf/evaluate.yaml``, or ``ConfigError`` naming every problem."""
    return validated_config(lambda: EvalConfig, cfg)


def validate_translate(cfg: DictConfig) -> TranslateConfig:
    """The typed ``TranslateConfig`` of a composed ``conf/translate.yaml``, or ``ConfigError`` naming every problem."""
    return validated_config(lambda: TranslateConfig, cfg)


def validated_config(model_now: Callable[[], type], cfg: DictConfig) -> Any:
    """``cfg`` typed by the model ``model_now`` gives once the plugins asked for are imported (a run's
    saved plugins are never imported on their own), every problem at once."""
    data, unset, problems = plain(cfg)
    if isinstance(data.get("plugins"), list) and all(isinstance(p, str) for p in data["plugins"]):
        import_plugins(data["plugins"])
    model = model_now()
    problems += [ConfigError(f"{key} is not read by attnseq. Did you mean {match}?",
                             f"use {match}=<value> (without +), and drop {key}, e.g. ~{key}.")
                 for key, match in near_misses(model, data)]
    try:
        typed = model.model_validate(data)
    except ValidationError as error:
        typed, problems = None, problems + told(error, model, data, unset=unset)
        if issubclass(model, TrainBase) and not {item["loc"][0] for item in error.errors()} & set(METRIC_KEYS):
            view = {key: TypeAdapter(model.model_fields[key].annotation).validate_python(data[key])
                    for key in METRIC_KEYS}  # what the monitored metrics need is sound: judge them all the same
            problems += metric_problems(SimpleNamespace(**view))
    if isinstance(typed, TrainBase):
        problems += architecture_problems(typed.model, typed.encoder, typed.scorer, typed.decoder, typed.attention)
        problems += vocabulary_problems(typed.model, TASKS.lookup(typed.dataset.task))
        problems += metric_problems(typed) + average_problems(typed) + cadence_problems(typed)
    if isinstance(typed, EvalConfig | TranslateConfig):
        problems += n_best_problems(typed)
    raise_all(problems)
    if isinstance(typed, TrainBase):
        check_memory(typed, memory_budget(typed))
    return typed


def n_best_problems(cfg: EvalConfig | TranslateConfig) -> list[ConfigError]:
    """``n_best`` ≤ ``beam_size``: a beam of K keeps K hypotheses, so it has K best at most."""
    decoding, prefix = (cfg.eval, "eval.") if isinstance(cfg, EvalConfig) else (cfg, "")
    n_best, beam_size = decoding.n_best, decoding.beam_size
    if n_best <= beam_size:
        return []
    return [ConfigError(f"{prefix}n_best={n_best} is more than {prefix}beam_size={beam_size}: a beam keeps "
                        f"{prefix}beam_size hypotheses, so it has no {n_best} best.",
                        f"set {prefix}beam_size={n_best} (or wider), or {prefix}n_best={beam_size}.")]


def suite_spec(cfg: TrainBase, stage: str) -> SuiteSpec:
    """What ``stage`` (val, test, train) of the run ``cfg`` describes can measure."""
    task = TASKS.lookup(cfg.dataset.task)
    return SuiteSpec(stage, max_length=cfg.dataset.eval_lengths[1], bucket_width=cfg.dataset.bucket_width,
                     train_lengths=tuple(cfg.dataset.train_lengths), attention=cfg.scorer.name != NO_ATTENTION,
                     gold_alignment=task.has_gold_alignment, text=task.is_text,
                     faith=cfg.faith.groups() if stage == "val" else (),
                     text_scores=tuple(dict.fromkeys(cfg.training.val_text_scores)) if stage == "val" else SCORES)


_ABSENT = object()


def as_it_ran(saved: DictConfig) -> DictConfig:
    """A run's stored config (``resume=``) with each key added since it was stored set to the value that
    does what the run did (``KEYS_ADDED_SINCE``), so the resumed run goes on logging what it logged."""
    for key, value in KEYS_ADDED_SINCE.items():
        if OmegaConf.select(saved, key, default=_ABSENT) is _ABSENT:
            OmegaConf.update(saved, key, value, force_add=True)
    return saved


def logged_metrics(cfg: TrainBase, stage: str = "val") -> list[str]:
    """The epoch metrics ``Seq2SeqLitModule`` logs for ``cfg`` in ``stage`` (val or test), then the
    training ones (``train/loss``, ``train/padding_fraction``, ``train/lr``), the plugins' included."""
    return names(suite_spec(cfg, stage)) + names(suite_spec(cfg, "train"))


def near_misses(model: Any, data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """``(key, the key it is a typo of)`` for each key added with ``+`` to a group that takes added keys
    (``+model.dropuot``); the groups handed on are judged by their callable's signature instead."""
    if not (isinstance(model, type) and issubclass(model, BaseModel) and isinstance(data, dict)) \
            or model.model_config.get("extra") != "allow" or model in HANDED_ON:
        return []
    known = {field.alias or name: field for name, field in model.model_fields.items()}
    return [pair for key, value in data.items() for pair in (
        near_misses(known[key].annotation, value, f"{prefix}{key}.") if key in known else
        [(f"{prefix}{key}", f"{prefix}{m}") for m in difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)])]


def metric_problems(cfg: TrainBase) -> list[ConfigError]:
    """``checkpoint.monitor`` is a metric logged during fit, with a ``checkpoint.mode`` that keeps the
    best of it; ``optimized_metric`` one logged by the end (test metrics too with test_after_fit)."""
    during_fit = logged_metrics(cfg)
    by_end = during_fit + (names(suite_spec(cfg, "test")) if cfg.training.test_after_fit else [])
    problems = []
    for key, metric, valid in (("checkpoint.monitor", cfg.checkpoint.monitor, during_fit),
                               ("optimized_metric", cfg.optimized_metric, by_end)):
        stage, _, score = metric.partition("/")
        text = suite_spec(cfg, "val").text
        if metric not in valid and stage == "val" and score in SCORES and text:  # a text score validation skips
            scores = [*dict.fromkeys(cfg.training.val_text_scores), score]
            problems.append(ConfigError(
                f"{key}={metric} is not computed at validation (training.val_text_scores="
                f"{shown(cfg.training.val_text_scores)}).",
                f"add it, e.g. {override('training.val_text_scores', scores)}",
            ))
        elif metric not in valid:
            match = closest(metric, valid)
            buckets = [m for m in valid if "_len/" in m]
            listed = [m for m in valid if "_len/" not in m]
            problems.append(ConfigError(
                f"{key}={shown(metric)} is not a metric this run logs.{did_you_mean(metric, valid)}",
                f"set {key} to one of {', '.join(listed)}, or a length bucket "
                f"({buckets[0]} … {buckets[-1]}), e.g. {key}={match or listed[0]}.",
            ))
    monitor, mode = cfg.checkpoint.monitor, cfg.checkpoint.mode
    wanted = "min" if lower_is_better(monitor) else "max"
    if mode != wanted and monitor in during_fit:
        problems.append(ConfigError(
            f"checkpoint.mode={mode} with checkpoint.monitor={monitor} keeps the worst checkpoint as 'best': "
            f"{monitor} is better when {'lower' if wanted == 'min' else 'higher'}.",
            f"set checkpoint.mode={wanted}.",
        ))
    return problems


def average_problems(cfg: TrainBase) -> list[ConfigError]:
    """``average.k`` checkpoints can be averaged only if the run validates that many times, where the
    config tells how often (an epoch limit, and validation at a fraction of each epoch)."""
    k, trainer = cfg.average.k, cfg.trainer
    interval, every_n = trainer.val_check_interval or 1.0, trainer.check_val_every_n_epoch or 1
    if k is None or trainer.max_epochs is None or not isinstance(interval, float):
        return []
    per_epoch = int(1 / interval)  # validating epochs' validations
    count = 0 if trainer.limit_val_batches == 0 else trainer.max_epochs // every_n * per_epoch
    if k <= count:
        return []
    if count == 0:
        return [ConfigError(f"average.k={k} averages validation checkpoints, and trainer.limit_val_batches=0 "
                            "turns validation off.", "set average.k=null, or trainer.limit_val_batches=1.0.")]
    every = f" with trainer.check_val_every_n_epoch={every_n}" if every_n > 1 else ""
    return [ConfigError(
        f"average.k={k} is more than the {count} checkpoint{'s' if count != 1 else ''} this run validates "
        f"(trainer.max_epochs={trainer.max_epochs}{every}).",
        f"set average.k to at most {count} (average.k={count}), or train longer "
        f"(trainer.max_epochs={-(-k // per_epoch) * every_n}).",
    )]


def cadence_problems(cfg: TrainBase) -> list[ConfigError]:
    """``trainer.check_val_every_n_epoch=null`` counts ``trainer.val_check_interval``'s batches over the whole
    run, so that interval must be a number of batches (Lightning refuses a fraction of an epoch there)."""
    trainer = cfg.trainer
    over_the_run = "check_val_every_n_epoch" in trainer.model_fields_set and trainer.check_val_every_n_epoch is None
    if not over_the_run or isinstance(trainer.val_check_interval, int):
        return []
    return [ConfigError(
        f"trainer.check_val_every_n_epoch=null counts trainer.val_check_interval in batches over the whole run, "
        f"and trainer.val_check_interval={trainer.val_check_interval} is not a whole number of batches.",
        "set it to one, e.g. trainer.val_check_interval=2000 (validation every 2000 training batches), or drop "
        "trainer.check_val_every_n_epoch (~trainer.check_val_every_n_epoch).",
    )]


def plain(node: DictConfig, prefix: str = "") -> tuple[dict[str, Any], list[str], list[ConfigError]]:
    """A composed config as plain values, the keys left ``???`` (left out: they read as missing), and the
    values that cannot be resolved, each a problem; ``${hydra:...}`` without a Hydra run reads ``AT_RUN_TIME``."""
    values, unset, problems = {}, [], []
    for key in node:
        if f"{prefix}{key}" == "hydra":  # Hydra's own settings (a config composed with return_hydra_config)
            continue
        if OmegaConf.is_missing(node, key):
            unset.append(f"{prefix}{key}")
            continue
        try:
            value = node[key]
        except Exception as error:  # noqa: BLE001 - an interpolation that cannot be resolved
            raw = OmegaConf.to_container(node, resolve=False)[key]
            if isinstance(raw, str) and "${hydra:" in raw:
                values[key] = before_the_run(raw)
            else:
                problems.append(ConfigError(f"{prefix}{key}={raw} cannot be resolved: {str(error).splitlines()[0]}",
                                            f"set {prefix}{key} to a plain value, or make what it refers to exist "
                                            "(e.g. the environment variable)."))
            continue
        if isinstance(value, DictConfig):
            values[key], more_unset, more = plain(value, f"{prefix}{key}.")
            unset, problems = unset + more_unset, problems + more
        else:
            values[key] = OmegaConf.to_container(value, resolve=True) if isinstance(value, ListConfig) else value
    return values, unset, problems
