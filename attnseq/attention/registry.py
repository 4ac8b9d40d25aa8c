"""Every attention scorer class by the name users pick it with (``scorer=<name>``).

A scorer registers itself: defining a subclass of ``Attention`` with a ``name`` adds it here
(``Attention.__init_subclass__``), and its settings model (``attnseq.attention.settings``) to the
config's union. The config checks, ``build_attention``, the tests and the benchmark all read this
registry, so a new scorer is one class and one ``conf/scorer/<name>.yaml`` (docs/attention.md).
"""

from __future__ import annotations

from attnseq.attention.settings import NO_ATTENTION, ScorerSettings
from attnseq.registry import Registry, import_plugins

SCORERS = Registry("scorer", "scorer.name")
"""Every registered scorer class by its ``name``, in the order they were defined."""


def builtin_scorers() -> None:
    """Import the built-in scorer classes (torch), which registers them."""
    import attnseq.attention.multihead  # noqa: F401
    import attnseq.attention.scorers  # noqa: F401


def scorer_class(name: str) -> type:
    """The class registered as ``name``; an unknown name raises ``ConfigError`` listing the known ones."""
    builtin_scorers()
    return SCORERS.lookup(name)


def scorer_names(**capabilities: object) -> list[str]:
    """The registered names whose classes have every given capability, e.g.
    ``scorer_names(same_size=True)``; all of them without arguments."""
    builtin_scorers()
    return SCORERS.names(**capabilities)


__all__ = ["NO_ATTENTION", "SCORERS", "ScorerSettings", "import_plugins", "scorer_class", "scorer_names"]
