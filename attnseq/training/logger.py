"""``RunLogger``: Lightning's metrics, written through the run's ``TrackedRun``.

Lightning calls it on the global-zero process only. For a resumed run it drops every metric at a
step the run already holds (``logged_through``), so replayed steps are never logged twice. The run's
status is ``train()``'s to set, so ``finalize`` leaves it alone.
"""

from __future__ import annotations

from collections.abc import Mapping

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

from attnseq.tracking.run import TrackedRun


class RunLogger(Logger):
    def __init__(self, run: TrackedRun, experiment_id: str, logged_through: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self.run = run
        self.experiment_id = experiment_id
        self.logged_through = dict(logged_through or {})  # metric → the highest step the run already holds

    @property
    def name(self) -> str:
        return self.experiment_id

    @property
    def version(self) -> str:
        return self.run.run_id

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        """The config is logged as params when the run is created; the module has no others."""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        fresh = {k: v for k, v in metrics.items() if (step or 0) > self.logged_through.get(k, -1)}
        if fresh:
            self.run.log_metrics(fresh, step)

    def finalize(self, status: str) -> None:
        pass
