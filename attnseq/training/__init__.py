"""The training service: ``train(cfg)`` (``pipeline``), the builders it uses (``build``), the
LightningModule, sweeps; every record goes through ``attnseq.tracking``."""

from attnseq.training.build import build_datamodule, build_module, model_config, validate
from attnseq.training.lit_module import Seq2SeqLitModule
from attnseq.training.pipeline import train

__all__ = ["Seq2SeqLitModule", "build_datamodule", "build_module", "model_config", "train", "validate"]
