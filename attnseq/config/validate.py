"""Stage one of checking a composed config: every key attnseq owns, every problem at once, before
torch, Lightning or MLflow is imported (a typo is answered in well under two seconds). Stage two,
the keys handed on to those libraries, is ``attnseq.training.validation``."""

from __future__ import annotations

from omegaconf import DictConfig
from pydantic import ValidationError

from attnseq.config.memory import check_memory, memory_budget
from attnseq.config.models import EvalConfig, TrainBase, near_misses, train_config_model
from attnseq.config.problems import plain, raise_all, told
from attnseq.errors import ConfigError
from attnseq.model.config import architecture_problems
from attnseq.registry import import_plugins


def validate_train(cfg: DictConfig) -> TrainBase:
    """The typed ``TrainConfig`` of a composed ``conf/train.yaml``, or ``ConfigError`` naming every problem."""
    data, unset, problems = plain(cfg)
    plugins = data.get("plugins")
    if isinstance(plugins, list) and all(isinstance(p, str) for p in plugins):
        import_plugins(plugins)
    return _validated(train_config_model(), data, unset, problems)


def validate_evaluate(cfg: DictConfig) -> EvalConfig:
    """The typed ``EvalConfig`` of a composed ``conf/evaluate.yaml``, or ``ConfigError`` naming every problem."""
    data, unset, problems = plain(cfg)
    return _validated(EvalConfig, data, unset, problems)


def _validated(model: type, data: dict, unset: list[str], problems: list[ConfigError]):
    problems += [ConfigError(f"{key} is not read by attnseq. Did you mean {match}?",
                             f"use {match}=<value> (without +), and drop {key}, e.g. ~{key}.")
                 for key, match in near_misses(model, data)]
    typed = None
    try:
        typed = model.model_validate(data)
    except ValidationError as error:
        problems += told(error, model, data, unset=unset)
    if typed is not None and isinstance(typed, TrainBase):
        problems += architecture_problems(typed.model, typed.encoder, typed.scorer, typed.decoder)
        budget = memory_budget(typed)
        if budget is not None and not problems:
            try:
                check_memory(typed, budget)
            except ConfigError as error:
                problems.append(error)
    raise_all(problems)
    return typed
