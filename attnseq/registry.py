"""One registry pattern for every extension axis (scorer, encoder, decoder convention, task).

A choice is a pydantic settings model (``Choice``) whose tag field (``name``, ``kind``,
``convention``, ``task``) is a ``Literal`` of its own name: defining the class registers it in its
axis's ``Registry``, whose ``union()`` is the discriminated union the config validates against.
Capabilities are class attributes (``same_size``, ``has_gold_alignment``, ``is_text``), queried with
``names(**capabilities)``. Torch-free: the config is checked with it before anything heavy loads.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag

from attnseq.errors import ConfigError


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like ``word`` (a typo's likely meaning), or None if none is close."""
    found = difflib.get_close_matches(str(word), list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, candidates: Iterable[str], prefix: str = "") -> str:
    match = closest(word, candidates)
    return f" Did you mean {prefix}{match}?" if match else ""


class Registry(dict):
    """Classes by name for one axis; ``key`` is the config key that picks one (``scorer.name``)."""

    def __init__(self, axis: str, key: str, default: str | None = None, names_options: bool = True) -> None:
        super().__init__()
        self.axis, self.key, self.default = axis, key, default
        self.names_options = names_options
        """Whether each name is also its option's yaml name (``scorer=dot``); an encoder kind is not."""

    @property
    def tag(self) -> str:
        return self.key.rpartition(".")[2]

    def add(self, name: str, cls: type) -> None:
        """Register ``cls``; a second class under a taken name is a mistake, not an override."""
        taken = dict.get(self, name)
        if taken is not None and (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
            raise TypeError(f"{cls.__module__}.{cls.__qualname__}: the {self.axis} name {name!r} is taken by "
                            f"{taken.__module__}.{taken.__qualname__}; give it a name of its own.")
        self[name] = cls

    def lookup(self, name: str) -> type:
        """The class registered as ``name``; an unknown one raises ``ConfigError`` listing the known ones."""
        if name not in self:
            match = closest(name, self)
            article = "an" if self.axis[0] in "aeiou" else "a"
            raise ConfigError(
                f"{self.key}={name} is not {article} {self.axis} attnseq knows."
                + did_you_mean(name, self, f"{self.key}="),
                f"set {self.key} to one of {', '.join(self)}, e.g. {self.key}={match or next(iter(self))}; "
                f"{article} {self.axis} defined outside attnseq is registered by importing its module first: "
                "plugins=[your.module].",
            )
        return self[name]

    def names(self, **capabilities: object) -> list[str]:
        """The names whose classes have every given capability; all of them without arguments."""
        return [n for n, c in self.items() if all(getattr(c, k) == v for k, v in capabilities.items())]

    def having(self, **capabilities: object) -> _View:
        """A live view of ``names(**capabilities)`` (it sees classes registered later, by plugins)."""
        return _View(self, capabilities)

    def union(self, wrap: Callable[[type], type] = lambda cls: cls) -> Any:
        """The discriminated union of every registered settings model (each through ``wrap``), tagged by ``key``."""
        members = tuple(Annotated[wrap(cls), Tag(name)] for name, cls in self.items())
        return Annotated[Union[members], Discriminator(self._tag_of)]  # noqa: UP007 - a runtime tuple

    def _tag_of(self, value: Any) -> str | None:
        if isinstance(value, dict):
            return value.get(self.tag, self.default)
        return getattr(value, self.tag, self.default)


class _View:
    def __init__(self, registry: Registry, capabilities: dict[str, object]) -> None:
        self.registry, self.capabilities = registry, capabilities

    def __iter__(self) -> Iterator[str]:
        return iter(self.registry.names(**self.capabilities))

    def __contains__(self, name: object) -> bool:
        return name in list(self)

    def __repr__(self) -> str:
        return repr(tuple(self))


class Choice(BaseModel):
    """Base of every registered settings model: strict, frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    registry: ClassVar[Registry]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if cls.registry.tag in cls.__dict__.get("__annotations__", {}) and cls.choice_name() is not None:
            cls.registry.add(cls.choice_name(), cls)

    @classmethod
    def choice_name(cls) -> str | None:
        """The name the class is registered under (its tag field's literal), or None for a base."""
        field = cls.model_fields.get(cls.registry.tag)
        if field is None or typing.get_origin(field.annotation) is not Literal:
            return None
        return typing.get_args(field.annotation)[0]


PLUGINS_ENV = "ATTNSEQ_PLUGINS"
"""The served model's opt-in: the comma-separated plugins it may import (``evaluate.py`` takes ``plugins=[...]``)."""


def import_plugins(modules: Iterable[str]) -> None:
    """Import each module (dotted name) so that the choices it defines register themselves.

    Importing runs the module's code: only modules the user names (``plugins=[...]``) are imported.

    Raises:
        ConfigError: a module cannot be imported, raises, or exits (``sys.exit``) while imported;
            the message names it, with no traceback. A signal's exit (a subclass) goes through.
    """
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ConfigError(
                f"plugins: cannot import {module!r} ({error}).",
                "put the module's directory on PYTHONPATH, or fix the name in plugins=[...].",
            ) from None
        except SystemExit as error:
            if type(error) is not SystemExit:
                raise  # an interrupt (SIGTERM, Ctrl-C) that landed during the import
            raise ConfigError(
                f"plugins: importing {module!r} called sys.exit({error.code!r}); a plugin's import must only "
                "define its choices.",
                f"move the exit under `if __name__ == '__main__':` in {module}, or drop it from plugins=[...].",
            ) from None
        except Exception as error:  # noqa: BLE001 - a plugin may raise anything; the user must see which one
            raise ConfigError(
                f"plugins: importing {module!r} raised {type(error).__name__}: {error}{_where(error)}.",
                f"fix the module (`python -c 'import {module}'` shows the traceback), or drop it from plugins=[...].",
            ) from None


def require_plugins(modules: Iterable[str]) -> None:
    """A saved run's plugins, which whoever loads it (evaluation, the served model) must have
    imported on request: loading a run never runs the code it names on its own.

    Raises:
        ConfigError: naming the plugins not imported and how to ask for them.
    """
    import sys

    missing = [module for module in modules if module not in sys.modules]
    if missing:
        listed = ",".join(missing)
        raise ConfigError(
            f"the run was trained with plugins=[{listed}], not imported here: importing a plugin runs its code, "
            "so it is imported only when asked for.",
            f"if you trust that code, ask for it: evaluate.py ... plugins=[{listed}]; for the served model, "
            f"{PLUGINS_ENV}={listed} in its environment (each on PYTHONPATH).",
        )


def _where(error: BaseException) -> str:
    """`` (file:line)`` where ``error`` was raised, past the import machinery's own frames."""
    import traceback

    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not frame.filename.startswith("<")]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
