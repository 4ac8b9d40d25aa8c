"""A benchmark script imported in a test as the script itself sees its siblings."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@contextlib.contextmanager
def imported(name: str) -> Iterator[ModuleType]:
    """``benchmarks/<name>.py`` imported with its folder first on ``sys.path`` (the scripts import each other
    by their bare names); afterwards the folder leaves ``sys.path`` and every module loaded from it leaves
    ``sys.modules``, so that no later test finds ``cases`` or ``startup`` under those names."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
        for key, module in list(sys.modules.items()):
            if Path(getattr(module, "__file__", None) or "/").parent == BENCHMARKS:
                del sys.modules[key]
