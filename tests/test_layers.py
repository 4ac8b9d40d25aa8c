"""Lower layers never import higher ones: each import runs in a fresh interpreter and the test
reads which packages it pulled into ``sys.modules``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FRAMEWORKS = ("lightning", "pytorch_lightning", "mlflow", "hydra", "omegaconf")


def modules_loaded_by(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def top_level(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("module", ["attnseq.attention", "attnseq.model"])
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
