"""A pydantic model's errors told as attnseq tells every bad value (used by every settings model, so it
sits beside ``attnseq.errors`` at the bottom of the layers): one line per problem naming the
key and the value, what it must be (read from the field's type and range), and a paste-able fix:

    error: model.dropout=abc must be a number in [0, 1).
      Fix: set model.dropout to a number in [0, 1), e.g. model.dropout=0.1.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import annotated_types as at
from pydantic import AfterValidator, BaseModel, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from attnseq.errors import ConfigError
from attnseq.registry import did_you_mean


@dataclass(frozen=True)
class What:
    """Type metadata: what a value must be, in words, and the likely meant value from a bad one."""

    text: str
    repair: Callable[[Any], Any] | None = None


def _pair(value: list[int]) -> list[int]:
    if len(value) != 2 or not 1 <= value[0] <= value[1]:
        raise ValueError("not a [lo, hi] pair with 1 ≤ lo ≤ hi")
    return value


def _sorted_pair(value: Any) -> list[int]:
    lo, hi = sorted(int(v) for v in value)
    return [max(lo, 1), max(hi, 1)]


LengthRange = Annotated[list[int], AfterValidator(_pair),
                        What("a [lo, hi] pair of whole numbers with 1 ≤ lo ≤ hi", _sorted_pair)]
Text = Annotated[str, Field(min_length=1)]
"""A non-empty string."""


class ConfigProblems(ConfigError):
    """Every problem of a config at once; ``problem``/``fix`` join them, the message pairs them."""

    def __init__(self, problems: Sequence[ConfigError]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(p.problem for p in problems), "\n".join(p.fix for p in problems))
        if len(problems) > 1:
            lines = [f"{len(problems)} problems in the config:"]
            lines += [f"  {p.problem}\n    Fix: {p.fix}" for p in problems]
            self.args = ("\n".join(lines),)


def raise_all(problems: Sequence[ConfigError]) -> None:
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ConfigProblems(problems)


def shown(value: Any) -> str:
    """A value as it would be written on the command line: ``null``, ``true``, ``''``, ``[1, 2]``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value.strip() and value == value.strip() else repr(value)
    if type(value).__module__.startswith("omegaconf"):  # a DictConfig or ListConfig
        from omegaconf import OmegaConf

        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(item) for item in value) + "]"
    return str(value)


def validated(model: Any, data: dict[str, Any], prefix: str = "", unset: Sequence[str] = ()) -> Any:
    """``data`` validated by ``model`` (a model class, or a union: a ``TypeAdapter``'s type), or
    ``ConfigError`` with every problem at once."""
    from pydantic import TypeAdapter

    try:
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model.model_validate(data)
        return TypeAdapter(model).validate_python(data)
    except ValidationError as error:
        problems = told(error, model, data, prefix, unset)
    raise_all(problems)


def told(error: ValidationError, model: Any, data: Any, prefix: str = "",
         unset: Sequence[str] = ()) -> list[ConfigError]:
    """Each of pydantic's errors as a ``ConfigError`` in the user's keys."""
    problems: dict[str, ConfigError] = {}
    for item in error.errors():
        field, path, value, owner = walk(model, data, item["loc"])
        key = ".".join(str(p) for p in ((prefix,) if prefix else ()) + tuple(path))
        if key not in problems:
            known = [f.alias or n for n, f in owner.model_fields.items()] if owner is not None else []
            problems[key] = one(item, key, field, value, owner, unset, known, model if not path else None)
    return list(problems.values())


def one(item: dict, key: str, field: FieldInfo | None, value: Any, owner: Any, unset: Sequence[str],
        known: Sequence[str], root: Any = None) -> ConfigError:
    kind = item["type"]
    group, _, name = key.rpartition(".")
    members = _members(field.annotation if field is not None else root)
    if kind == "union_tag_invalid" and members:
        registry = next(iter(members.values())).registry
        try:
            registry.lookup(registry._tag_of(item["input"]))
        except ConfigError as error:
            return error
    if kind == "missing":
        example = shown(example_of(field, None))
        if key in unset:
            return ConfigError(f"{key} is not set (???), and this config needs it.",
                               f"add it on the command line, e.g. {key}={example}.")
        return ConfigError(f"{key} is missing from the config (was it deleted with ~{key}?).",
                           f"keep it, e.g. {key}={example}.")
    if kind == "extra_forbidden":
        choice = getattr(owner, "choice_name", lambda: None)()
        registry = getattr(owner, "registry", None)
        option = f"{registry.key.partition('.')[0]}" if registry is not None and registry.names_options else None
        whose = f"{option or registry.key}={choice}" if choice else f"this {group or 'config'}"
        return ConfigError(
            f"{key} is not a setting of {whose} (it takes {', '.join(f'{group}.{k}'.lstrip('.') for k in known)})."
            + did_you_mean(name, known, f"{group}." if group else ""),
            f"drop {key} (on the command line: ~{key}), or pick an option whose yaml file lists it.",
        )
    if kind in ("model_type", "model_attributes_type", "dict_type") or field is None:
        if isinstance(value, (dict, list)) or field is None:
            return ConfigError(f"{key}={shown(value)} is rejected: {item['msg']}.", f"set {key} to a valid value.")
        return ConfigError(f"{key}={shown(value)} replaces the whole {key} group with a value.",
                           f"set one of its keys instead, e.g. {key}.<key>=<value>; `--cfg job` prints them.")
    what = describe(field.annotation, field.metadata)
    note = "" if kind.endswith(SAID_BY_WHAT) else f" ({item['msg']})"
    return rejected(key, value, what, example_of(field, value), note)


SAID_BY_WHAT = ("_type", "_parsing", "greater_than", "less_than", "greater_than_equal", "less_than_equal",
                "literal_error", "finite_number", "string_too_short", "none_required", "value_error")
"""pydantic's error types that "must be <what>" already says."""


def rejected(key: str, value: Any, what: str, example: Any, note: str = "") -> ConfigError:
    """The one message every bad value gets: the key and value, what it must be, the fix."""
    return ConfigError(f"{key}={shown(value)} must be {what}.{note}",
                       f"set {key} to {what}, e.g. {key}={shown(example)}.")


def walk(model: Any, data: Any, loc: Sequence[Any]) -> tuple[FieldInfo | None, list[str], Any, Any]:
    """The field at a pydantic error location, the user's key path to it (union tags left out), the
    value there, and the model that holds the field."""
    field: FieldInfo | None = None
    annotation, path, value, owner = model, [], data, None
    for part in loc:
        members = _members(annotation)
        if members is not None:  # a discriminated union: this part is the tag
            annotation = members.get(part, annotation)
            if part in members:
                continue
        annotation = _optional_model(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            owner = annotation
            by_alias = {f.alias or n: f for n, f in annotation.model_fields.items()}
            field = by_alias.get(part)
            annotation = field.annotation if field is not None else None
        else:
            field = None
        path.append(str(part))
        value = value.get(part) if isinstance(value, dict) else (
            value[part] if isinstance(value, list) and isinstance(part, int) and part < len(value) else None)
    return field, path, value, owner


def _optional_model(annotation: Any) -> Any:
    """``Model | None`` → ``Model`` (a group that may be null, such as ``scheduler``)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) == 1:
            return models[0]
    return annotation


def _members(annotation: Any) -> dict[str, type] | None:
    """A discriminated union's members by tag (``Registry.union``), else None."""
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    found = {}
    for member in typing.get_args(annotation):
        if typing.get_origin(member) is Annotated:
            cls, *meta = typing.get_args(member)
            found.update({m.tag: cls for m in meta if hasattr(m, "tag")})
    return found or None


def example_of(field: FieldInfo | None, value: Any) -> Any:
    """The value a fix suggests: the repaired bad one, else the field's example, else its default."""
    if field is None:
        return "…"
    for meta in _metadata(field.annotation, field.metadata):
        if isinstance(meta, What) and meta.repair is not None:
            try:
                return meta.repair(value)
            except (TypeError, ValueError, IndexError):
                pass
    if field.examples:
        return field.examples[0]
    if field.default is not PydanticUndefined and field.default is not None:
        return field.default
    return "…"


def _metadata(annotation: Any, metadata: Sequence[Any] = ()) -> list[Any]:
    found = list(metadata)
    if typing.get_origin(annotation) is Annotated:
        found += list(typing.get_args(annotation)[1:])
    return found


def describe(annotation: Any, metadata: Sequence[Any] = ()) -> str:
    """An annotation and its constraints in words: ``PositiveInt | None`` → "a whole number ≥ 1, or null"."""
    meta = _metadata(annotation, metadata)
    for item in meta:
        if isinstance(item, What):
            return item.text
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [describe(arg) for arg in args if arg is not type(None) and _settable(arg)] or ["a value"]
        text = " or ".join(dict.fromkeys(parts))
        return f"{text}, or null" if type(None) in args else text
    if origin is Literal:
        return "one of " + ", ".join(shown(arg) for arg in args)
    if origin in (list, tuple) or annotation in (list, tuple):
        item = describe(args[0]) if args else "values"
        return f"a list of {item.removeprefix('a ').replace('string', 'strings')}"
    if origin in (dict, typing.Mapping) or annotation is dict:
        return "a mapping"
    if annotation is bool:
        return "true or false"
    if annotation is str:
        return "a non-empty string" if any(getattr(m, "min_length", None) for m in meta) else "a string"
    if annotation is type(None) or annotation is None:
        return "null"
    if annotation not in (int, float) and (origin is not None or isinstance(annotation, type)):
        return f"a {getattr(annotation, '__name__', str(annotation))}"
    low = {type(m): m for m in meta if isinstance(m, (at.Ge, at.Gt, at.Le, at.Lt))}
    whole = annotation is int
    noun = "a whole number" if whole else "a number"
    lo = low.get(at.Ge) or low.get(at.Gt)
    hi = low.get(at.Le) or low.get(at.Lt)
    if whole and isinstance(lo, at.Gt):
        lo = at.Ge(lo.gt + 1)
    if lo is not None and hi is not None:
        left = "[" if isinstance(lo, at.Ge) else "("
        right = "]" if isinstance(hi, at.Le) else ")"
        return f"{noun} in {left}{_bound(lo)}, {_bound(hi)}{right}"
    if lo is not None:
        return f"{noun if whole else 'a finite number'} {'≥' if isinstance(lo, at.Ge) else '>'} {_bound(lo)}"
    return noun if whole else "a finite number"


def _bound(item: at.Ge | at.Gt | at.Le | at.Lt) -> Any:
    return next(getattr(item, a) for a in ("ge", "gt", "le", "lt") if hasattr(item, a))


def _settable(annotation: Any) -> bool:
    """Whether a YAML value can ever be of this type (not an object such as a Callback)."""
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_settable(arg) for arg in typing.get_args(annotation))
    if origin is not None:
        return origin in (Literal, list, tuple, dict, typing.Mapping) or str(origin).endswith(("Sequence", "Iterable"))
    return annotation in (bool, int, float, str, type(None), list, tuple, dict)
