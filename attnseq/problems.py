"""A pydantic model's errors told as attnseq tells every bad value: one message per key naming it and
its value, what it must be (the field's JSON schema in words) and a paste-able fix. Every settings
model uses it, so it sits beside ``attnseq.errors`` at the bottom of the layers.

    error: model.dropout=abc must be a number in [0, 1).
      Fix: set model.dropout to a number in [0, 1), e.g. model.dropout=0.1

Every value a fix suggests pastes into a shell as printed (``override``: lists without spaces, a
value the shell would split or expand quoted)."""

from __future__ import annotations

import re
import shlex
import typing
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, PydanticUndefined

from attnseq.errors import ConfigError
from attnseq.registry import did_you_mean

PAIR = "a [lo, hi] pair of whole numbers with 1 ≤ lo ≤ hi"
Text = Annotated[str, Field(min_length=1)]


def What(text: str) -> Any:
    """Type metadata: what a value must be, in words, where its type's own would say less."""
    return Field(json_schema_extra={"what": text})


def _pair(value: list[int]) -> list[int]:
    if len(value) != 2 or not 1 <= value[0] <= value[1]:  # the fix suggests the pair in order
        raise PydanticCustomError("pair", PAIR, {"example": sorted(max(v, 1) for v in value) if len(value) == 2
                                                 else None})
    return value


LengthRange = Annotated[list[int], AfterValidator(_pair), What(PAIR)]


class ConfigProblems(ConfigError):
    """Every problem of a config at once; ``problem``/``fix`` join them, the message pairs them."""

    def __init__(self, problems: Sequence[ConfigError]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(p.problem for p in problems), "\n".join(p.fix for p in problems))
        lines = [f"  {p.problem}\n    Fix: {p.fix}" for p in problems]
        self.args = ("\n".join([f"{len(problems)} problems in the config:", *lines]),)


def raise_all(problems: Sequence[ConfigError]) -> None:
    if problems:
        raise problems[0] if len(problems) == 1 else ConfigProblems(problems)


def shown(value: Any) -> str:
    """A value as the command line writes it: ``null``, ``true``, ``''``, ``[1,2]`` (no space: a pasted
    ``key=[1, 2]`` is two words to the shell); a long text cut short."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str) and len(value) > 80:
        return f"{shown(value[:60])}… ({len(value)} characters)"
    if isinstance(value, str):
        return value if value.strip() and value == value.strip() else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(shown(item) for item in value) + "]"
    return str(value)


_SHELL_SPECIAL = re.compile(r"[\s'\"$`\\;&|<>()*!#]")


def override(key: str, value: Any) -> str:
    """``key=value`` as a fix suggests it, to paste into a shell as printed: ``model.dropout=0.1``,
    ``dataset.train_lengths=[1,6]``, ``'mlflow.run_name=my run'`` (quoted where the shell would split
    or expand it)."""
    text = f"{key}={shown(value)}"
    return shlex.quote(text) if _SHELL_SPECIAL.search(text) else text


def validated(model: Any, data: Any, prefix: str = "", unset: Sequence[str] = ()) -> Any:
    """``data`` validated by ``model`` (a model class or a union), or ``ConfigError`` naming every problem."""
    try:
        return model.model_validate(data) if models_in(model) == [model] else TypeAdapter(model).validate_python(data)
    except ValidationError as error:
        problems = told(error, model, data, prefix, unset)
    raise_all(problems)


def told(error: ValidationError, model: Any, data: Any, prefix: str = "", unset: Sequence[str] = ()) -> list:
    """Each of pydantic's errors as a ``ConfigError`` in the user's keys, one per key (``unset``: left ``???``)."""
    problems: dict[str, ConfigError] = {}
    for item in error.errors():
        path, value, field, owner = walk(model, data, item["loc"])
        key = ".".join([prefix] * bool(prefix) + path)
        problems[key] = problems.get(key) or one(item, key, value, field, owner, field.annotation if field else model,
                                                 key in unset)
    return list(problems.values())


def walk(model: Any, data: Any, loc: Sequence[Any]) -> tuple[list[str], Any, FieldInfo | None, Any]:
    """The user's key path to a pydantic error location (union tags and members, list indices left
    out), the value there, its field and the model holding it."""
    path, value, field, owner, annotation = [], data, None, None, model
    for part in loc:
        models = models_in(annotation)
        tagged = [m for m in models if getattr(m, "choice_name", lambda: None)() == part]
        if tagged:  # a discriminated union's tag
            annotation = tagged[0]
            continue
        fields = {f.alias or n: f for n, f in models[0].model_fields.items()} if models else {}
        if part in fields or (isinstance(value, dict) and (part in value or part == loc[-1])):
            owner, field = (models[0] if models else None), fields.get(part)
            annotation = field.annotation if field is not None else None
            path.append(str(part))
            value = value.get(part) if isinstance(value, dict) else None
    return path, value, field, owner


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation is or holds (a union's, an ``Annotated``'s, an optional's)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def one(item: dict, key: str, value: Any, field: FieldInfo | None, owner: Any, annotation: Any,
        unset: bool = False) -> ConfigError:
    """The message one pydantic error gets; a bad value's is always its key and value, what it must be, the fix."""
    kind, (group, _, name) = item["type"], key.rpartition(".")
    if kind == "union_tag_invalid":  # a choice's name: the registry says which it knows
        try:
            models_in(annotation)[0].registry.lookup(item["ctx"]["tag"])
        except ConfigError as error:
            return error
    example = example_of(field, item)
    if kind == "missing" and str(item["loc"][-1]) == name:  # not an item of a list or tuple
        return ConfigError(f"{key} is not set (???), and this config needs it." if unset else
                           f"{key} is missing from the config (was it deleted with ~{key}?).",
                           f"{'add it on the command line' if unset else 'keep it'}, e.g. {override(key, example)}")
    if kind == "extra_forbidden":
        known = [f.alias or n for n, f in getattr(owner, "model_fields", {}).items()]
        choice, registry = getattr(owner, "choice_name", lambda: None)(), getattr(owner, "registry", None)
        whose = f"{registry.key.partition('.')[0] if registry.names_options else registry.key}={choice}" if choice \
            else f"this {group or 'config'}"
        return ConfigError(f"{key} is not a setting of {whose} (it takes "
                           f"{', '.join(f'{group}.{k}'.lstrip('.') for k in known)})." + did_you_mean(
                               name, known, f"{group}." if group else ""),
                           f"drop {key} (on the command line: ~{key}), or pick an option whose yaml file lists it.")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return ConfigError(f"{key}={shown(value)} replaces the whole {key} group with a value.",
                           f"set one of its keys instead, e.g. {key}.<key>=<value>; `--cfg job` prints them.")
    what = describe(field.annotation, field) if field is not None else item["msg"].removeprefix("Input should be ")
    what = item["msg"].removeprefix("Value error, ") if kind == "value_error" else what
    return ConfigError(f"{key}={shown(value)} must be {what}.", f"set {key} to {what}, e.g. {override(key, example)}")


def example_of(field: FieldInfo | None, item: dict | None = None) -> Any:
    """The value a fix suggests: the bad one repaired (a validator's ``example``), else the field's
    first example, else its default."""
    repaired = ((item or {}).get("ctx") or {}).get("example")
    if repaired is not None or field is None:
        return "…" if repaired is None else repaired
    if field.examples:
        return field.examples[0]
    if field.default is not PydanticUndefined and field.default is not None:
        return field.default
    return allowed(schema_of(field.annotation, field))  # e.g. +optimizer.fused=maybe: true


def schema_of(annotation: Any, field: FieldInfo | None = None) -> dict:
    """The JSON schema of an annotation with a field's constraints; {} for a type that has none."""
    meta = [Field(json_schema_extra=field.json_schema_extra), *field.metadata] if field is not None else [Field()]
    try:
        config = None if models_in(annotation) else ConfigDict(arbitrary_types_allowed=True)
        return TypeAdapter(Annotated[(annotation, *meta)], config=config).json_schema()
    except Exception:  # noqa: BLE001 - a type with no JSON schema
        return {}


def describe(annotation: Any, field: FieldInfo | None = None) -> str:
    """An annotation (with a field's constraints) in words, read from its JSON schema:
    ``PositiveInt | None`` → "a whole number ≥ 1, or null"."""
    schema = schema_of(annotation, field)
    return words(schema) if schema else "a valid value"


def allowed(schema: dict) -> Any:
    """A value ``schema`` allows, for a fix's example where the field names none: the first choice, true,
    the least number in range; "…" where no one value stands for the type (a string, a list)."""
    if "anyOf" in schema:
        found = [allowed(part) for part in schema["anyOf"] if part.get("type") != "null"]
        return next((value for value in found if value != "…"), "…")
    if "enum" in schema or "const" in schema:
        return schema.get("enum", [schema.get("const")])[0]
    kind = schema.get("type")
    if kind == "boolean":
        return True
    if kind not in ("integer", "number"):
        return "…"
    if "minimum" in schema:
        return schema["minimum"]
    lo, hi = schema.get("exclusiveMinimum"), schema.get("maximum", schema.get("exclusiveMaximum"))
    if lo is not None and hi is not None and kind == "number":
        return (lo + hi) / 2
    if lo is not None:
        return lo + 1
    if hi is not None:
        return hi if "maximum" in schema else hi - 1
    return 1


def words(schema: dict) -> str:
    if "what" in schema:
        return schema["what"]
    if "anyOf" in schema:
        parts = [p for p in schema["anyOf"] if p.get("type") != "null"]
        text = " or ".join(dict.fromkeys(words(p) for p in parts)) or "a value"
        return f"{text}, or null" if len(parts) < len(schema["anyOf"]) else text
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return shown(values[0]) if len(values) == 1 else "one of " + ", ".join(shown(v) for v in values)
    kind = schema.get("type")
    if kind == "array":
        count = f"{schema['maxItems']} " if schema.get("minItems") == schema.get("maxItems") is not None else ""
        item = words(schema.get("items") or (schema.get("prefixItems") or [{}])[0]).removeprefix("a ")
        item = f"values from {item.removeprefix('one of ')}" if item.startswith("one of ") else item
        return f"a list of {count}{item.replace('string', 'strings').replace('number', 'numbers')}"
    if kind not in ("integer", "number"):
        return {"boolean": "true or false", "null": "null", "object": "a mapping", "string": "a non-empty string"
                if schema.get("minLength") else "a string"}.get(kind, "a value")
    whole = kind == "integer"
    lo, lo_open = (schema["exclusiveMinimum"], True) if "exclusiveMinimum" in schema else (schema.get("minimum"), False)
    hi, hi_open = (schema["exclusiveMaximum"], True) if "exclusiveMaximum" in schema else (schema.get("maximum"), False)
    if whole and lo_open:
        lo, lo_open = lo + 1, False
    if lo is not None and hi is not None:
        return f"{'a whole number' if whole else 'a number'} in {'(['[not lo_open]}{lo}, {hi}{')]'[not hi_open]}"
    noun = "a whole number" if whole else "a finite number"
    return noun if lo is None else f"{noun} {'>' if lo_open else '≥'} {lo}"
