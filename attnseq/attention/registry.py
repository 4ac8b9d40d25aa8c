"""Every attention scorer class by the name users pick it with (``scorer=<name>``).

A scorer registers itself: defining a subclass of ``Attention`` with a ``name`` adds it here
(``Attention.__init_subclass__``), and its settings model (``attnseq.attention.settings``) to the
config's union. The config checks, ``build_attention`` (``attnseq.attention.build``, which imports the
built-in scorers and looks them up), the tests and the benchmark all read this
registry, so a new scorer is one class and one ``conf/scorer/<name>.yaml`` (docs/attention.md).
"""

from __future__ import annotations

from attnseq.attention.settings import NO_ATTENTION, ScorerSettings
from attnseq.registry import Registry, import_plugins

SCORERS = Registry("scorer", "scorer.name")
"""Every registered scorer class by its ``name``, in the order they were defined."""


__all__ = ["NO_ATTENTION", "SCORERS", "ScorerSettings", "import_plugins"]
