"""benchmarks/optimizer_step.py: the fused and the default optimizer step side by side on the same batches,
with gradient accumulation as train() steps; a tiny model, a few batches."""

from __future__ import annotations

import pytest
from benchmark_scripts import imported  # tests/ on sys.path


@pytest.fixture(scope="module")
def optimizer_step():
    with imported("optimizer_step") as module:
        yield module


def test_both_steps_are_timed_on_the_same_batches_and_only_one_is_fused(optimizer_step, tmp_path):
    overrides = ["dataset.train_size=96", "dataset.batch_size=16", "model.hidden_size=8", "model.embedding_dim=8",
                 "trainer.accumulate_grad_batches=2"]
    found = optimizer_step.measure(overrides, batches=8, warmup=2, threads=1, workdir=tmp_path)
    assert {side: values["fused"] for side, values in found.items()} == {"fused": True, "default": False}
    for values in found.values():
        assert len(values["ms"]) == len(values["step_ms"]) == 6  # 8 batches, 2 of warm-up
        assert all(0 < step <= whole for step, whole in zip(values["step_ms"], values["ms"], strict=True))
    table = optimizer_step.render(found, overrides, threads=1)
    assert "| fused (attnseq's) | yes |" in table and "| PyTorch's default | no |" in table
    assert "**" in table.splitlines()[-1]  # the ratio
