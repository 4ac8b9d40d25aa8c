"""Lower layers never import higher ones: read from every module's source, and for the model
library in a fresh interpreter, from which packages one import pulls into ``sys.modules``."""

from __future__ import annotations

import ast
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
