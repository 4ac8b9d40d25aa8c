"""The training service: LightningModule, MLflow tracking, sweeps and ``train(cfg)``."""

from attnseq.training.lit_module import Seq2SeqLitModule
from attnseq.training.run import train

__all__ = ["Seq2SeqLitModule", "train"]
