"""Every attention scorer by the name users pick it with (``scorer=<name>``), and the import of
scorers defined outside the package.

A scorer registers itself: defining a subclass of ``Attention`` with a ``name`` adds it here
(``Attention.__init_subclass__``). The config checks, ``build_attention``, the tests and the
benchmark all read this registry, so a new scorer is one class and one ``conf/scorer/<name>.yaml``
(docs/attention.md, "Adding a scorer").
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from attnseq.errors import ConfigError

if TYPE_CHECKING:
    from attnseq.attention.base import Attention

NO_ATTENTION = "none"
"""The scorer name of the fixed-vector baseline: no attention at all."""

SCORERS: dict[str, type[Attention]] = {}
"""Every registered scorer class by its ``name``, in the order they were defined."""


def register(cls: type[Attention]) -> None:
    """Add ``cls`` under ``cls.name``; a second class under a taken name is a mistake, not an override."""
    name = cls.name
    if name == NO_ATTENTION:
        raise TypeError(f"{cls.__qualname__}: the scorer name {NO_ATTENTION!r} is the no-attention baseline's.")
    taken = SCORERS.get(name)
    if taken is not None and (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__}: the scorer name {name!r} is taken by "
            f"{taken.__module__}.{taken.__qualname__}; give the new scorer a name of its own."
        )
    SCORERS[name] = cls


def scorer_class(name: str) -> type[Attention]:
    """The class registered as ``name``; an unknown name raises ``ConfigError`` listing the known ones."""
    if name not in SCORERS:
        raise ConfigError(
            f"unknown scorer {name!r}.",
            f"use scorer= one of {[NO_ATTENTION, *SCORERS]}; a scorer defined outside attnseq is "
            "registered by importing its module first: plugins=[your.module].",
        )
    return SCORERS[name]


def scorer_names(**capabilities: object) -> list[str]:
    """The registered names whose classes have every given capability, e.g.
    ``scorer_names(same_size=True)``; all of them without arguments."""
    return [
        name
        for name, cls in SCORERS.items()
        if all(getattr(cls, key) == value for key, value in capabilities.items())
    ]


def import_plugins(modules: Iterable[str]) -> None:
    """Import each module (dotted name) so that the scorers it defines register themselves."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ConfigError(
                f"plugins: cannot import {module!r} ({error}).",
                "put the module's directory on PYTHONPATH, or fix the name in plugins=[...].",
            ) from error
