"""Stage two of checking a training config, once torch and Lightning are imported and before any data
or run exists: the groups handed on as arguments (``trainer.*`` to ``lightning.Trainer``,
``optimizer.*``/``scheduler.*`` to their ``_target_``) bound to the callable's signature, the
learning rate of every epoch, the batch against the accelerator's memory."""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import typing
from collections.abc import Callable
from typing import Any

import torch
from pydantic import ConfigDict, Field, ValidationError, create_model

from attnseq.config.memory import check_memory, memory_budget, on_accelerator
from attnseq.config.models import TrainBase
from attnseq.errors import ConfigError
from attnseq.problems import override, raise_all, shown, told
from attnseq.registry import closest, did_you_mean

SET_BY_ATTNSEQ = {"logger": "the MLflow logger", "callbacks": "the checkpoint, artifact and guard callbacks",
                  "default_root_dir": "paths.output_dir"}  # lightning.Trainer arguments the pipeline passes itself
SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def check_handed_on(cfg: TrainBase) -> None:
    """Every problem of the groups handed on as arguments, then of the schedule and the memory."""
    import lightning as L

    problems = [ConfigError(f"trainer.{name} is set by attnseq itself ({passed_as}).",
                            f"drop it (on the command line: ~trainer.{name}).")
                for name, passed_as in SET_BY_ATTNSEQ.items() if name in arguments(cfg.trainer)]
    problems += bound("trainer", arguments(cfg.trainer), L.Trainer.__init__, "lightning.Trainer", SET_BY_ATTNSEQ)
    found = {}
    for group, home, base, first in (("optimizer", torch.optim, torch.optim.Optimizer, "params"),
                                     ("scheduler", torch.optim.lr_scheduler, SCHEDULERS, "optimizer")):
        settings = found[group] = getattr(cfg, group)
        try:
            if settings is not None:
                found[group] = locate(f"{group}._target_", settings.target, home, base)
                problems += bound(group, arguments(settings), found[group].__init__, settings.target, [first])
        except ConfigError as error:
            problems.append(error)
    raise_all(problems)
    try:
        make_scheduler = found["scheduler"] and functools.partial(found["scheduler"], **arguments(cfg.scheduler))
        check_schedule(found["optimizer"]([torch.nn.Parameter(torch.zeros(1))], **arguments(cfg.optimizer)),
                       make_scheduler, epochs=cfg.trainer.max_epochs or 1,
                       per_step=cfg.scheduler is not None and cfg.scheduler.interval == "step")
    except ConfigError:
        raise
    except (ValueError, TypeError) as error:
        raise ConfigError(f"the optimizer or scheduler config is rejected: {error}",
                          "fix the optimizer.* / scheduler.* value it names, e.g. optimizer.lr=0.001.") from None
    if on_accelerator(cfg) and torch.cuda.is_available():
        check_memory(cfg, memory_budget(cfg, torch.cuda.get_device_properties(0).total_memory))


def arguments(group: Any) -> dict[str, Any]:
    """The keyword arguments a handed-on group gives its callable (the keys set to a value, ``_target_``
    left out): a key set to null is left to the callable's own default (``optimizer.weight_decay``), but
    for those whose null the callable reads as a choice of its own (the group's ``NULL_HANDED_ON``)."""
    own = getattr(group, "READ_BY_ATTNSEQ", ())  # e.g. scheduler.interval: when attnseq steps it
    null_handed_on = getattr(group, "NULL_HANDED_ON", ())  # e.g. trainer.check_val_every_n_epoch
    return {k: v for k, v in group.model_dump(exclude_unset=True, by_alias=True).items()
            if not k.startswith("_") and k not in own and (v is not None or k in null_handed_on)}


def bound(group: str, values: dict[str, Any], function: Callable, owner: str, skip: Any = ()) -> list[ConfigError]:
    """torchtune's check: ``values`` bind to ``function``'s signature, and pydantic judges each against
    its annotation (YAML has no tuples: a list stands for one)."""
    parameters = {n: p for n, p in inspect.signature(function).parameters.items() if n not in {"self", *skip}
                  and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    try:
        hints = typing.get_type_hints(function, include_extras=True)  # with the ranges of Annotated[...]
    except Exception:  # noqa: BLE001 - an annotation that cannot be evaluated: the names are still checked
        hints = {}
    problems = [ConfigError(f"{group}.{name} is not an argument of {owner}."
                            + did_you_mean(name, parameters, f"{group}."),
                            f"drop it (on the command line: ~{group}.{name}), or use one of its arguments: "
                            f"{', '.join(sorted(parameters))}.") for name in values if name not in {*parameters, *skip}]
    defaults = {name: parameters[name].default for name in values if name in parameters}  # the fix's examples
    fields = {name: (hints.get(name, Any), Field(examples=[d] if isinstance(d, (int, float, str)) else None))
              for name, d in defaults.items()}
    try:
        model = create_model(owner, __config__=ConfigDict(arbitrary_types_allowed=True, allow_inf_nan=False), **fields)
        model.model_validate({name: values[name] for name in fields})
    except ValidationError as error:
        problems += told(error, model, values, group)
    except Exception:  # noqa: BLE001 - an annotation pydantic cannot read: the callable judges
        pass
    return problems


def locate(key: str, path: str, home: Any, base: type | tuple[type, ...]) -> type:
    """The class a ``_target_`` names; a typo gets the closest class name in its module (or in ``home``)."""
    module_name, _, name = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except (ImportError, ValueError):
        module = None
    found = getattr(module, name, None)
    if isinstance(found, type) and issubclass(found, base):
        return found
    bases = base if isinstance(base, tuple) else (base,)

    def classes(where: Any) -> list[str]:
        return sorted(n for n, v in vars(where).items() if isinstance(v, type) and issubclass(v, bases)
                      and v not in bases and not n.startswith("_"))

    search = module if module is not None and classes(module) else home
    names, match = classes(search), closest(name, classes(search))
    kind = "an optimizer class" if home is torch.optim else "a learning-rate scheduler class"
    problem = f"{key}={path} cannot be imported" if found is None else \
        f"{key}={path} is not {kind} (a subclass of {' or '.join(f'{b.__module__}.{b.__qualname__}' for b in bases)})"
    raise ConfigError(f"{problem}.{f' Did you mean {search.__name__}.{match}?' if match else ''}",
                      f"set {key} to {kind}, e.g. {key}={search.__name__}.{match or names[0]} "
                      f"({search.__name__} has: {', '.join(names)}).")


def check_schedule(optimizer: torch.optim.Optimizer, make_scheduler: Callable | None, epochs: int,
                   per_step: bool = False) -> None:
    """The learning rate every epoch of the schedule gives (``per_step``: each of the first 1000
    optimizer steps) is finite and positive (``optimizer.lr=inf``, ``scheduler.gamma=-1`` are not)."""
    scheduler = make_scheduler(optimizer) if make_scheduler is not None else None
    unit = "at optimizer step" if per_step else "in epoch"
    for index in range(1000 if per_step else max(1, min(epochs, 1000))):
        bad = [lr for lr in (float(g["lr"]) for g in optimizer.param_groups) if not (math.isfinite(lr) and lr > 0)]
        if bad:
            keywords = getattr(make_scheduler, "keywords", {})  # the scheduler.* values, e.g. scheduler.gamma=-1
            given = "".join(f", {override(f'scheduler.{k}', v)}" for k, v in keywords.items())
            raise ConfigError(
                f"the learning rate {unit} {index + per_step} would be {bad[0]} (optimizer.lr="
                f"{shown(optimizer.defaults['lr'])}, scheduler {type(scheduler).__name__ if scheduler else 'none'}"
                f"{given}): it must stay finite and > 0.",
                "set optimizer.lr to a finite number > 0, e.g. optimizer.lr=0.003, and a scheduler that keeps it "
                "positive and finite (e.g. scheduler.gamma=0.6) or scheduler=null.")
        if scheduler is None or isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            return
        optimizer.step()
        scheduler.step()
