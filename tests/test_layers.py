"""Lower layers never import higher ones: read from every module's source, and for the model
library in a fresh interpreter, from which packages one import pulls into ``sys.modules``."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

import attnseq

FRAMEWORKS = ("lightning", "pytorch_lightning", "mlflow", "hydra", "omegaconf")
PACKAGE_ROOT = Path(attnseq.__file__).parent


def modules_loaded_by(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def top_level(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("module", ["attnseq.attention", "attnseq.model", "attnseq.faithfulness.probe"])
def test_the_model_library_needs_no_training_framework(module):
    loaded = modules_loaded_by(module)
    assert not top_level(loaded) & set(FRAMEWORKS), sorted(top_level(loaded) & set(FRAMEWORKS))
    assert not {m for m in loaded if m.startswith(("attnseq.training", "attnseq.evaluation"))}


def test_the_data_package_loads_lightning_only_for_its_data_module():
    assert "lightning" not in top_level(modules_loaded_by("attnseq.data"))
    from attnseq.data import DATA_TASKS, Seq2SeqDataModule
    from attnseq.data.datamodule import DATA_TASKS as defined
    from attnseq.data.datamodule import Seq2SeqDataModule as module_class

    assert Seq2SeqDataModule is module_class and DATA_TASKS == defined


LAYERS = {
    # package: the attnseq packages it may import (besides attnseq.errors, .problems and .registry)
    "kernels": set(),
    "attention": {"kernels"},
    "data": set(),
    "metrics": set(),
    "model": {"kernels", "attention", "data"},
    "faithfulness": {"kernels", "attention", "data", "metrics", "model"},  # what validation and evaluation run
    "tracking": set(),
    "config": {"kernels", "attention", "data", "metrics", "model"},  # every choice's settings; the metrics' names
    "serving": {"kernels", "attention", "data", "model", "tracking"},
    "lifecycle": {"tracking"},
    "training": {"kernels", "attention", "data", "metrics", "model", "faithfulness", "tracking", "config", "serving",
                 "lifecycle"},
    "evaluation": {"kernels", "attention", "data", "metrics", "model", "faithfulness", "tracking", "config", "serving",
                   "lifecycle"},
}
"""The layering the README's "Layout" describes, bottom first."""


def attnseq_imports(path) -> set[str]:
    """The attnseq packages a module imports, read from its source (lazy imports included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name.split(".")[1] for name in names if name.startswith("attnseq.") and name.count(".") >= 1}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_layer_imports_only_the_layers_below_it(package):
    allowed = LAYERS[package] | {package, "errors", "problems", "registry"}
    offending = {
        str(path.relative_to(PACKAGE_ROOT)): sorted(attnseq_imports(path) - allowed)
        for path in sorted((PACKAGE_ROOT / package).glob("*.py"))
        if attnseq_imports(path) - allowed
    }
    assert not offending, offending


def test_every_package_has_its_place_in_the_layering():
    packages = {path.name for path in PACKAGE_ROOT.iterdir() if (path / "__init__.py").exists()}
    assert packages == set(LAYERS)


def test_mlflow_client_lives_in_tracking_only():
    """tracking/ is the one door to MLflow: every other module reaches the store through its
    ``TrackingClient`` and ``TrackedRun``."""
    outside = [
        str(path.relative_to(PACKAGE_ROOT)) for path in sorted(PACKAGE_ROOT.rglob("*.py"))
        if path.relative_to(PACKAGE_ROOT).parts[0] != "tracking" and "MlflowClient" in path.read_text()
    ]
    assert outside == []


def test_only_the_entry_points_reach_the_runtime():
    """Process-wide effects are the entry points': no package module imports ``attnseq.runtime``
    or ``attnseq.cli``."""
    offending = {
        str(path.relative_to(PACKAGE_ROOT)): sorted(attnseq_imports(path) & {"runtime", "cli"})
        for package in LAYERS for path in sorted((PACKAGE_ROOT / package).glob("*.py"))
        if attnseq_imports(path) & {"runtime", "cli"}
    }
    assert not offending, offending


# -- no private API of a dependency ---------------------------------------------------------------
ENTRY_POINTS = ("train.py", "evaluate.py", "translate.py", "build_corpus.py")
PUBLIC_UNDERSCORED = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
"""Names that start with ``_`` and are public API all the same (a namedtuple's methods)."""
LIBRARY_OBJECTS = {"trainer"}
"""Names that hold another library's object wherever our code uses them (Lightning's ``Trainer``:
``trainer``, ``self.trainer``, ``pl_module.trainer``)."""
ATTRIBUTE_BY_NAME = {"getattr", "setattr", "hasattr", "delattr"}


def is_private(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("_") and not dunder and name not in PUBLIC_UNDERSCORED


def is_third_party(module: str) -> bool:
    top = module.split(".")[0]
    return top != "attnseq" and top not in sys.stdlib_module_names


def reaches_a_library(node: ast.expr, bound: set[str]) -> bool:
    """Whether ``node`` (what an attribute is read from) is, or is reached from, a name an import of a
    third-party package binds (``torch``, ``L``, ``MlflowClient``) or a library object (``trainer``)."""
    while True:
        if isinstance(node, ast.Name):
            return node.id in bound or node.id in LIBRARY_OBJECTS
        if isinstance(node, ast.Attribute):
            if node.attr in LIBRARY_OBJECTS:
                return True
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return False


@functools.cache
def inherited_private_names() -> frozenset[str]:
    """The private names the library classes ours derive from give their instances (torch's ``nn.Module``
    and optimizers, Lightning's ``LightningModule`` and ``Callback``): ``_forward_hooks``, ``_modules``, …,
    private wherever they are read, ``self`` included (our code defines none of them)."""
    import lightning as L
    import torch

    instances = (torch.nn.Linear(1, 1), L.LightningModule(), L.Callback(),
                 torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    return frozenset(name for instance in instances for name in {*dir(instance), *vars(instance)} if is_private(name))


def private_api_uses(source: str, filename: str = "<source>", inherited: frozenset[str] = frozenset()) -> list[str]:
    """Where ``source`` uses a private name of another package: an import of a module path or a name with
    a part starting with ``_`` from a third-party package (``hydra._internal``, ``from mlflow.server import
    _X``); ``X._y`` where ``X`` is bound by an import of a third-party package or is a library object
    (``trainer``), however deep (``trainer.fit_loop.epoch_loop._y``); and ``getattr(obj, "_y")`` (and
    ``setattr``, ``hasattr``, ``delattr``) on anything but ``self`` or ``cls``, the way to hide such a
    read; ``X._y`` for any ``X`` where ``_y`` is one of the ``inherited`` names (a library base class's
    private, ``attention._forward_hooks``). Our own objects' private names (``self._x``, ``other._tokens``)
    and the standard library's are not a dependency's."""
    tree = ast.parse(source, filename=filename)
    found: list[str] = []
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_third_party(alias.name):
                    if any(is_private(part) for part in alias.name.split(".")):
                        found.append(f"{filename}:{node.lineno}: import {alias.name}")
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and is_third_party(node.module):
            for alias in node.names:
                if any(is_private(part) for part in [*node.module.split("."), alias.name]):
                    found.append(f"{filename}:{node.lineno}: from {node.module} import {alias.name}")
                bound.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr) and (
                node.attr in inherited or reaches_a_library(node.value, bound)):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_BY_NAME
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and is_private(node.args[1].value)
              and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_private_api_of_a_dependency_is_used():
    """The package and the entry points use every library through its public API only."""
    repo = PACKAGE_ROOT.parent
    paths = [*sorted(PACKAGE_ROOT.rglob("*.py")), *(repo / name for name in ENTRY_POINTS)]
    inherited = inherited_private_names()
    assert {"_forward_hooks", "_modules"} <= inherited
    found = [use for path in paths
             for use in private_api_uses(path.read_text(), str(path.relative_to(repo)), inherited)]
    assert found == []


PLANTED = {
    "a private module path": "from hydra._internal.utils import get_args_parser",
    "a private module imported": "import hydra._internal.utils as hydra_utils",
    "a private name imported": "from mlflow.server import _UVICORN_LOG_CONFIG",
    "a module's private attribute": "import torch\n\ndef f():\n    return torch.nn.functional._canonical_mask",
    "an aliased module's": "import lightning as L\n\nL.pytorch._graveyard",
    "an imported class's": "from mlflow.tracking import MlflowClient\n\nMlflowClient._tracking_client",
    "the trainer's, deep": "def step(trainer):\n    return trainer.fit_loop.epoch_loop._batches_that_stepped",
    "the trainer's, through self": "def stop(self):\n    self.trainer.strategy._launcher.kill(15)",
    "read by name": "def f(self):\n    return getattr(self.trainer, '_signal_connector', None)",
    "read by name from a local": "def f(operations):\n    return getattr(operations, '_operation_futures', [])",
}
OWN_PRIVATE = '''
import os
from collections import namedtuple
from attnseq.problems import _pair
from . import _local

Pair = namedtuple("Pair", "a b")


class Vocab:
    def __init__(self):
        self._tokens = []

    def __eq__(self, other):
        return self._tokens == other._tokens and getattr(self, "_tokens") is not None

    def moved(self, pair):
        return pair._replace(a=1), pair._asdict(), type(self).__name__, os._exit
'''


@pytest.mark.parametrize("source", PLANTED.values(), ids=PLANTED)
def test_the_private_api_check_catches_a_planted_use(source):
    assert len(private_api_uses(source)) == 1, private_api_uses(source)


def test_the_private_api_check_catches_a_library_base_classs_private_name_on_our_objects():
    source = "def fuses(self):\n    attention = self.attention\n    return not attention._forward_hooks"
    assert private_api_uses(source) == []  # a local of ours: only the base classes' names tell
    assert len(private_api_uses(source, inherited=frozenset({"_forward_hooks"}))) == 1


def test_the_private_api_check_leaves_our_own_private_names_and_the_standard_librarys_alone():
    assert private_api_uses(OWN_PRIVATE, inherited=inherited_private_names()) == []
