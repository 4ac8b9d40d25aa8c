"""The optimizer train() makes: PyTorch's fused step where it applies (``attnseq.training.optimizers``),
the same update as an Adam step written out here, and the configs and trainers that keep the default step."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir

from attnseq.config import validate_train
from attnseq.training.build import build_datamodule, build_module, optimizer_factory
from attnseq.training.optimizers import OptimizerFactory

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
SMALL = ["dataset.train_size=32", "dataset.val_size=16", "model.hidden_size=8", "model.embedding_dim=8"]


def config(tmp_path: Path, overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*SMALL, *overrides, f"paths.output_dir={tmp_path / 'out'}",
                                          f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    return validate_train(cfg)


def parameters(seed: int = 0, dtype=torch.float32) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator, dtype=dtype)) for shape in ((5, 3), (7,))]


def gradients(params: list[torch.nn.Parameter], step: int) -> None:
    generator = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator, dtype=p.dtype)


def adam_by_hand(params, steps: int, lr: float, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
    """Kingma & Ba's Adam (decoupled: Loshchilov & Hutter's AdamW) on copies of ``params``, in float64."""
    values = [p.detach().double().clone() for p in params]
    m = [torch.zeros_like(v) for v in values]
    v2 = [torch.zeros_like(v) for v in values]
    for t in range(1, steps + 1):
        grads = [g.double() for g in _grads(params, t - 1)]
        for i, (x, g) in enumerate(zip(values, grads, strict=True)):
            if decoupled:
                x.mul_(1 - lr * weight_decay)
            elif weight_decay:
                g = g + weight_decay * x
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v2[i] = betas[1] * v2[i] + (1 - betas[1]) * g * g
            m_hat, v_hat = m[i] / (1 - betas[0] ** t), v2[i] / (1 - betas[1] ** t)
            x.sub_(lr * m_hat / (v_hat.sqrt() + eps))
    return values


def _grads(params, step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=generator, dtype=p.dtype) for p in params]


@pytest.mark.parametrize("target, decoupled", [("torch.optim.Adam", False), ("torch.optim.AdamW", True)])
def test_the_default_optimizer_is_fused_and_steps_as_adam_written_out(target, decoupled, tmp_path):
    cfg = config(tmp_path, [f"optimizer._target_={target}", "optimizer.weight_decay=0.1", "optimizer.lr=0.01"])
    params = parameters()
    optimizer = optimizer_factory(cfg.optimizer)(params)
    assert optimizer.param_groups[0]["fused"] is True
    expected = adam_by_hand(params, steps=5, lr=0.01, weight_decay=0.1, decoupled=decoupled)
    for step in range(5):
        gradients(params, step)
        optimizer.step()
    for got, want in zip(params, expected, strict=True):
        torch.testing.assert_close(got.detach().double(), want, rtol=1e-5, atol=1e-6)


def test_the_fused_and_the_default_step_agree(tmp_path):
    cfg = config(tmp_path, ["optimizer.lr=0.01"])
    fused, default = parameters(), parameters()
    optimizers = [optimizer_factory(cfg.optimizer)(fused), torch.optim.Adam(default, lr=0.01, weight_decay=0.0)]
    assert [bool(o.param_groups[0]["fused"]) for o in optimizers] == [True, False]
    for step in range(20):
        for params, optimizer in zip((fused, default), optimizers, strict=True):
            gradients(params, step)
            optimizer.step()
    for a, b in zip(fused, default, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overrides", [
    ["+optimizer.fused=false"],          # the config's own choice
    ["+optimizer.foreach=true"],         # another way of stepping, chosen: fused would refuse it
    ["optimizer._target_=torch.optim.RMSprop"],  # a class without a fused step
])
def test_a_config_that_chooses_the_step_or_a_class_without_one_keeps_it(overrides, tmp_path):
    optimizer = optimizer_factory(config(tmp_path, overrides).optimizer)(parameters())
    assert not optimizer.param_groups[0].get("fused")
    gradients(optimizer.param_groups[0]["params"], 0)
    optimizer.step()


def test_half_precision_parameters_or_mixed_precision_keep_the_default_step():
    factory = OptimizerFactory(torch.optim.Adam, {"lr": 0.01})
    assert factory(parameters()).param_groups[0]["fused"] is True
    assert not factory(parameters(dtype=torch.bfloat16)).param_groups[0]["fused"]
    assert not factory(parameters(), full_precision=False).param_groups[0]["fused"]


@pytest.mark.parametrize("precision, fused", [("32-true", True), ("bf16-mixed", False)])
def test_training_gets_the_fused_step_in_full_precision_only(precision, fused, tmp_path):
    """Through Lightning's own loop, with the config's gradient clipping: under mixed precision Lightning
    would refuse to clip for a fused optimizer, so the step there is the default one and training runs."""
    cfg = config(tmp_path, [])
    datamodule = build_datamodule(cfg)
    datamodule.setup()
    module = build_module(cfg, datamodule)
    trainer = L.Trainer(accelerator="cpu", devices=1, precision=precision, fast_dev_run=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        gradient_clip_val=cfg.trainer.gradient_clip_val, num_sanity_val_steps=0)
    before = [p.detach().clone() for p in module.parameters()]
    trainer.fit(module, datamodule=datamodule)
    [optimizer] = trainer.optimizers
    assert bool(optimizer.param_groups[0]["fused"]) is fused
    assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))  # it stepped
