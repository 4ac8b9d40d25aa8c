"""Config schemas: what each key of a composed config must be, checked before anything is created.

A schema is a table ``{dotted key: Check}`` (``attnseq.training.validation.TRAIN_SCHEMA``,
``attnseq.evaluation.validation.EVALUATE_SCHEMA``). A ``Check`` says in words what a value must be
("a whole number ≥ 1") and holds an example for the fix, so every rejected key reads the same way:

    error: model.dropout=abc must be a number in [0, 1).
      Fix: set model.dropout to a number in [0, 1), e.g. model.dropout=0.1

Keys passed on to a library as keyword arguments (``trainer.*`` to ``lightning.Trainer``,
``optimizer.*`` to the optimizer class) are checked against that callable's signature instead:
``check_arguments`` names an argument it does not take (with the closest one it does) and a value
that does not fit the argument's type annotation.
"""

from __future__ import annotations

import difflib
import inspect
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from attnseq.errors import ConfigError

ABSENT = object()
"""What ``value_at`` returns for a key the config does not have."""
AT_RUN_TIME = object()
"""What ``value_at`` returns for a value Hydra fills in at run time, read without a Hydra run."""


def shown(value: Any) -> str:
    """A value as it would be written on the command line: ``null``, ``true``, ``''``, ``[1, 2]``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value.strip() and value == value.strip() else repr(value)
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(item) for item in value) + "]"
    return str(value)


def is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Check:
    """What one key's value must be: ``test`` decides, ``what`` says it, ``example`` shows it."""

    what: str
    test: Callable[[Any], bool]
    example: Any
    required: bool = True
    """False for keys only some options of a group have (``dataset.path``, ``scorer.attn_dim``)."""
    repair: Callable[[Any], Any] | None = None
    """The value the user most likely meant, from the bad one (``[5, 2]`` → ``[2, 5]``); None: the example."""

    def example_for(self, value: Any) -> Any:
        try:
            repaired = self.repair(value) if self.repair is not None else None
        except (TypeError, ValueError, IndexError):
            repaired = None
        return self.example if repaired is None else repaired

    def accepts(self, value: Any) -> bool:
        try:
            return bool(self.test(value))
        except (TypeError, ValueError):
            return False


def whole(minimum: int | None = None, maximum: int | None = None, *, example: int) -> Check:
    if minimum is not None and maximum is not None:
        what = f"a whole number in [{minimum}, {maximum}]"
    elif minimum is not None:
        what = f"a whole number ≥ {minimum}"
    else:
        what = "a whole number"
    return Check(
        what,
        lambda v: is_whole(v) and (minimum is None or v >= minimum) and (maximum is None or v <= maximum),
        example,
    )


def number(
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    above: bool = False,
    below: bool = False,
    example: float,
) -> Check:
    """A finite number; ``above``/``below`` exclude the bounds themselves."""
    if minimum is not None and maximum is not None:
        what = f"a number in {'(' if above else '['}{minimum}, {maximum}{')' if below else ']'}"
    elif minimum is not None:
        what = f"a finite number {'>' if above else '≥'} {minimum}"
    else:
        what = "a finite number"

    def test(v: Any) -> bool:
        if not is_number(v) or not math.isfinite(v):
            return False
        low_ok = minimum is None or (v > minimum if above else v >= minimum)
        high_ok = maximum is None or (v < maximum if below else v <= maximum)
        return low_ok and high_ok

    return Check(what, test, example)


def flag(*, example: bool = True) -> Check:
    return Check("true or false", lambda v: isinstance(v, bool), example)


def one_of(options: Iterable[str], *, example: str | None = None) -> Check:
    options = tuple(options)
    return Check(f"one of {', '.join(options)}", lambda v: isinstance(v, str) and v in options,
                 options[0] if example is None else example)


def text(*, example: str) -> Check:
    return Check("a non-empty string", lambda v: isinstance(v, str) and v.strip() != "", example)


def texts(*, example: Sequence[str]) -> Check:
    return Check(
        "a list of non-empty strings",
        lambda v: isinstance(v, (list, tuple, ListConfig)) and all(isinstance(x, str) and x.strip() for x in v),
        list(example),
    )


def length_range(*, example: Sequence[int]) -> Check:
    def test(v: Any) -> bool:
        return (isinstance(v, (list, tuple, ListConfig)) and len(v) == 2 and all(is_whole(x) for x in v)
                and 1 <= v[0] <= v[1])

    def repair(v: Any) -> list[int] | None:
        if not (isinstance(v, (list, tuple, ListConfig)) and len(v) == 2 and all(is_whole(x) for x in v)):
            return None
        lo, hi = sorted(v)
        return [max(lo, 1), max(hi, 1)]

    return Check("a [lo, hi] pair of whole numbers with 1 ≤ lo ≤ hi", test, list(example), repair=repair)


def optional(check: Check) -> Check:
    return replace(check, what=f"{check.what}, or null", test=lambda v: v is None or check.test(v))


def absent_ok(check: Check) -> Check:
    return replace(check, required=False)


# -- reading and checking -------------------------------------------------------------------------


def value_at(cfg: DictConfig, key: str) -> Any:
    """The resolved value at a dotted key; ``ABSENT`` if there is none or it is ``???`` (the builders
    say which key must be set); ``AT_RUN_TIME`` if Hydra fills it in at run time (``${hydra:...}``)
    and there is no Hydra run (a config composed in a test or a notebook)."""
    node: Any = cfg
    parent: Any = None
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return ABSENT
        if OmegaConf.is_missing(node, part):
            return ABSENT
        parent = node
        try:
            node = node[part]
        except OmegaConfBaseException as error:
            raw = OmegaConf.to_container(parent, resolve=False)[part]
            if isinstance(raw, str) and "${hydra:" in raw:
                return AT_RUN_TIME
            raise ConfigError(
                f"{key}={raw} cannot be resolved: {str(error).splitlines()[0]}",
                f"set {key} to a plain value, or make what it refers to exist (e.g. the environment variable).",
            ) from None
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node


def rejected(key: str, value: Any, what: str, example: Any, note: str = "") -> ConfigError:
    """The one message every bad value gets: the key and value, what it must be, the fix."""
    fix = f"set {key} to {what}, e.g. {key}={shown(example)}"
    return ConfigError(f"{key}={shown(value)} must be {what}.{' ' + note if note else ''}", fix + ".")


def check_table(cfg: DictConfig, table: Mapping[str, Check]) -> None:
    """Raise ``ConfigError`` for the first key of ``table`` whose value fails its check (in table order)."""
    for key, check in table.items():
        value = value_at(cfg, key)
        if value is AT_RUN_TIME:
            continue
        if value is ABSENT:
            if check.required and not _is_unset(cfg, key):
                raise ConfigError(
                    f"{key} is missing from the config (was it deleted with ~{key}?).",
                    f"keep it, e.g. {key}={shown(check.example)}.",
                )
            continue
        if not check.accepts(value):
            raise rejected(key, value, check.what, check.example_for(value))


def _is_unset(cfg: DictConfig, key: str) -> bool:
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return isinstance(node, DictConfig) and last in node and OmegaConf.is_missing(node, last)


def check_groups(cfg: DictConfig, groups: Iterable[str]) -> None:
    """Each group is a mapping of settings (``model=foo`` on the command line replaces it by a string)."""
    for group in groups:
        if group in cfg and not isinstance(cfg[group], DictConfig) and cfg[group] is not None:
            raise ConfigError(
                f"{group}={shown(cfg[group])} replaces the whole {group} group with a value.",
                f"set one of its keys instead, e.g. {group}.<key>=<value>; `--cfg job` prints them.",
            )


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like ``word`` (a typo's likely meaning), or None if none is close."""
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, candidates: Iterable[str], prefix: str = "") -> str:
    match = closest(word, candidates)
    return f" Did you mean {prefix}{match}?" if match else ""


# -- keyword arguments of a callable ------------------------------------------------------------


def keyword_arguments(function: Callable, skip: Iterable[str] = ()) -> dict[str, inspect.Parameter]:
    """The arguments ``function`` takes by keyword (``self`` and ``skip`` left out)."""
    skipped = {"self", *skip}
    return {
        name: parameter
        for name, parameter in inspect.signature(function).parameters.items()
        if name not in skipped and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }


def check_arguments(group: str, values: Mapping[str, Any], function: Callable, owner: str,
                    skip: Iterable[str] = ()) -> None:
    """Every ``group.<name>`` is an argument of ``function`` whose annotation its value fits."""
    arguments = keyword_arguments(function, skip)
    hints = _type_hints(function)
    for name, value in values.items():
        if name.startswith("_"):
            continue  # _target_, _partial_: read by hydra.utils.instantiate
        if name not in arguments:
            raise ConfigError(
                f"{group}.{name} is not an argument of {owner}.{did_you_mean(name, arguments, f'{group}.')}",
                f"drop it (on the command line: ~{group}.{name}), or use one of its arguments: "
                f"{', '.join(sorted(arguments))}.",
            )
        annotation = hints.get(name, arguments[name].annotation)
        if not fits(value, annotation):
            raise rejected(f"{group}.{name}", value, describe(annotation), _example_for(arguments[name]),
                           f"({owner} takes {name}: {_annotation_text(annotation)}.)")
        if is_number(value) and not math.isfinite(value):
            raise rejected(f"{group}.{name}", value, "a finite number", _example_for(arguments[name]))


def _type_hints(function: Callable) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - an annotation that cannot be evaluated: read the raw one
        return {}


def _example_for(parameter: inspect.Parameter) -> Any:
    default = parameter.default
    return default if default is not inspect.Parameter.empty and isinstance(default, (int, float, str, bool)) else "…"


def fits(value: Any, annotation: Any) -> bool:
    """Whether a value from a YAML config can be passed where ``annotation`` is declared.

    Understands what signatures use: unions and Optional, Literal, bool/int/float/str, lists,
    tuples, dicts; an annotation it cannot read (a string, a class no YAML value can be) fits
    only values of that class.
    """
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    if isinstance(annotation, str):
        return True  # an unevaluated forward reference: nothing to check against
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arg) for arg in args)
    if origin is typing.Literal:
        return any(type(value) is type(arg) and value == arg for arg in args)
    if annotation is type(None) or annotation is None:
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return is_whole(value)
    if annotation is float:
        return is_number(value)
    if annotation is str:
        return isinstance(value, str)
    if origin in (list, tuple, Sequence, Iterable) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple, ListConfig)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(fits(v, a) for v, a in zip(value, args))
        item = args[0] if args else Any
        return all(fits(v, item) for v in value)
    if origin in (dict, Mapping) or annotation is dict:
        return isinstance(value, (dict, DictConfig))
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True  # an annotation this reader does not know: let the callable judge


def describe(annotation: Any) -> str:
    """An annotation in the words a message uses: ``Optional[int]`` → "a whole number, or null"."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [describe(arg) for arg in args if arg is not type(None) and _settable(arg)]
        text_ = " or ".join(dict.fromkeys(parts)) or "a value"
        return f"{text_}, or null" if type(None) in args else text_
    if origin is typing.Literal:
        return "one of " + ", ".join(shown(arg) for arg in args)
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
    if annotation in names:
        return names[annotation]
    if origin in (list, tuple, Sequence, Iterable) or annotation in (list, tuple):
        return f"a list of {describe(args[0]) if args else 'values'}".replace("a list of a ", "a list of ")
    if origin in (dict, Mapping) or annotation is dict:
        return "a mapping"
    return f"a {getattr(annotation, '__name__', str(annotation))}"


def _settable(annotation: Any) -> bool:
    """Whether a YAML value can ever be of this type (not an object such as a Callback)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_settable(arg) for arg in typing.get_args(annotation))
    if origin is not None:
        return origin in (typing.Literal, list, tuple, Sequence, Iterable, dict, Mapping)
    return annotation in (bool, int, float, str, type(None), list, tuple, dict)


def _annotation_text(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
