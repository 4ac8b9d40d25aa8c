"""Stage two of checking a training config, once torch and Lightning are imported and before any
data, store or run exists: the keys handed on as arguments (``trainer.*`` to ``lightning.Trainer``,
``optimizer.*``/``scheduler.*`` to the classes their ``_target_`` names) bound to the callable's
signature, every problem at once; the learning rate stays positive; the batch fits the accelerator.
Stage one is ``attnseq.config.validate_train`` (every key attnseq owns, the monitored metrics)."""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import typing
from collections.abc import Callable
from typing import Any

import torch
from pydantic import ConfigDict, TypeAdapter, ValidationError

from attnseq.config.memory import MemoryBudget, check_memory, on_accelerator
from attnseq.config.models import TrainBase
from attnseq.errors import ConfigError
from attnseq.problems import describe, raise_all, rejected, shown
from attnseq.registry import closest, did_you_mean

SET_BY_ATTNSEQ = {
    "logger": "the MLflow logger",
    "callbacks": "the checkpoint, artifact and guard callbacks",
    "default_root_dir": "paths.output_dir",
}
"""``lightning.Trainer`` arguments the training pipeline passes itself."""


def check_handed_on(cfg: TrainBase) -> None:
    """Every problem of the groups handed on as arguments, then of the schedule and memory."""
    import lightning as L

    problems = [ConfigError(f"trainer.{name} is set by attnseq itself ({passed_as}).",
                            f"drop it (on the command line: ~trainer.{name}).")
                for name, passed_as in SET_BY_ATTNSEQ.items() if name in arguments(cfg.trainer)]
    problems += bound("trainer", arguments(cfg.trainer), L.Trainer.__init__, "lightning.Trainer", SET_BY_ATTNSEQ)
    optimizer = scheduler = None
    try:
        optimizer = locate("optimizer._target_", cfg.optimizer.target, torch.optim, torch.optim.Optimizer)
        problems += bound("optimizer", arguments(cfg.optimizer), optimizer.__init__, cfg.optimizer.target, ["params"])
    except ConfigError as error:
        problems.append(error)
    if cfg.scheduler is not None:
        bases = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        try:
            scheduler = locate("scheduler._target_", cfg.scheduler.target, torch.optim.lr_scheduler, bases)
            problems += bound("scheduler", arguments(cfg.scheduler), scheduler.__init__, cfg.scheduler.target,
                              ["optimizer"])
        except ConfigError as error:
            problems.append(error)
    raise_all(problems)
    make_scheduler = functools.partial(scheduler, **arguments(cfg.scheduler)) if scheduler else None
    try:
        check_schedule(optimizer([torch.nn.Parameter(torch.zeros(1))], **arguments(cfg.optimizer)), make_scheduler,
                       epochs=cfg.trainer.max_epochs or 1)
    except (ValueError, TypeError) as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"the optimizer or scheduler config is rejected: {error}",
                          "fix the optimizer.* / scheduler.* value it names, e.g. optimizer.lr=0.001.") from None
    if on_accelerator(cfg) and torch.cuda.is_available():
        from attnseq.config.memory import physical_memory

        check_memory(cfg, MemoryBudget(physical_memory() or 0, torch.cuda.get_device_properties(0).total_memory))


def arguments(group: Any) -> dict[str, Any]:
    """The keyword arguments a handed-on group gives its callable (the keys set, ``_target_`` left out)."""
    return {k: v for k, v in group.model_dump(exclude_unset=True, by_alias=True).items() if not k.startswith("_")}


def bound(group: str, values: dict[str, Any], function: Callable, owner: str, skip: Any = ()) -> list[ConfigError]:
    """torchtune's check: ``values`` bind to ``function``'s signature, each fitting its annotation."""
    signature = inspect.signature(function)
    takes = [n for n, p in signature.parameters.items() if n not in {"self", *skip}
             and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - an annotation that cannot be evaluated: the names are still checked
        hints = {}
    problems = []
    for name, value in values.items():
        if name in skip:
            continue
        if name not in takes:
            problems.append(ConfigError(
                f"{group}.{name} is not an argument of {owner}.{did_you_mean(name, takes, f'{group}.')}",
                f"drop it (on the command line: ~{group}.{name}), or use one of its arguments: "
                f"{', '.join(sorted(takes))}.",
            ))
            continue
        annotation = hints.get(name, signature.parameters[name].annotation)
        default = signature.parameters[name].default
        example = default if isinstance(default, (int, float, str, bool)) else "…"
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(rejected(f"{group}.{name}", value, "a finite number", example))
        elif annotation is not inspect.Parameter.empty and not _fits(value, annotation):
            problems.append(rejected(f"{group}.{name}", value, describe(annotation), example,
                                     f" ({owner} takes {name}: {_text(annotation)}.)"))
    return problems


def _fits(value: Any, annotation: Any) -> bool:
    try:
        adapter = TypeAdapter(annotation, config=ConfigDict(arbitrary_types_allowed=True, strict=True))
    except Exception:  # noqa: BLE001 - an annotation pydantic cannot read: let the callable judge
        return True
    for candidate in ([tuple(value), value] if isinstance(value, list) else [value]):  # YAML has no tuples
        try:
            adapter.validate_python(candidate)
            return True
        except ValidationError:
            pass
    return False


def _text(annotation: Any) -> str:
    if typing.get_args(annotation) or not hasattr(annotation, "__name__"):
        return str(annotation).replace("typing.", "")
    return annotation.__name__


def locate(key: str, path: str, home: Any, base: type | tuple[type, ...]) -> type:
    """The class a ``_target_`` names; a typo gets the closest name in its module (or in ``home``)."""
    module_name, _, name = path.rpartition(".")
    try:
        module = importlib.import_module(module_name) if module_name else None
    except ImportError:
        module = None
    found = getattr(module, name, None) if module is not None else None
    kind = "an optimizer class" if home is torch.optim else "a learning-rate scheduler class"
    if not (isinstance(found, type) and issubclass(found, base)):
        search = module if module is not None and _classes(module, base) else home
        names = _classes(search, base)
        match = closest(name, names)
        bases = " or ".join(f"{b.__module__}.{b.__qualname__}" for b in (base if isinstance(base, tuple) else (base,)))
        problem = (f"{key}={path} cannot be imported" if found is None else f"{key}={path} is not {kind} (a subclass "
                   f"of {bases})")
        raise ConfigError(
            f"{problem}.{f' Did you mean {search.__name__}.{match}?' if match else ''}",
            f"set {key} to {kind}, e.g. {key}={search.__name__}.{match or names[0]} "
            f"({search.__name__} has: {', '.join(names)}).",
        )
    return found


def _classes(module: Any, base: type | tuple[type, ...]) -> list[str]:
    """The public subclasses of ``base`` a module holds (the abstract bases themselves left out)."""
    bases = base if isinstance(base, tuple) else (base,)
    return sorted(name for name, value in vars(module).items() if isinstance(value, type) and issubclass(value, base)
                  and value not in bases and not name.startswith("_"))


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
