"""``Seq2SeqDataModule``: a run's data (``attnseq.data.corpus.Seq2SeqData``) as Lightning's data module,
for training: the Trainer calls its ``setup`` and dataloaders, and under data-parallel training its
loaders shard by the Trainer's world size and rank. Everything else is ``Seq2SeqData``'s.
"""

from __future__ import annotations

import lightning as L

from attnseq.data.corpus import DATA_TASKS, Seq2SeqData

__all__ = ["DATA_TASKS", "Seq2SeqDataModule"]


class Seq2SeqDataModule(Seq2SeqData, L.LightningDataModule):
    """``Seq2SeqData`` with Lightning's data-module hooks (``Seq2SeqData.__init__`` calls Lightning's through
    ``super()``): the same arguments, the same data."""

    def _replicas(self) -> tuple[int, int]:
        """(processes, this one's rank) under data-parallel training, from the Trainer it is attached to."""
        if self.trainer is None or self.trainer.world_size == 1:
            return 1, 0
        return self.trainer.world_size, self.trainer.global_rank
