"""attnseq's Optuna sweeper, a Hydra ``Sweeper`` plugin: one study shared by every worker that names the
same ``storage`` and ``study_name`` (``conf/hydra/sweeper/study.yaml``, used by ``hparams_search=optuna``).

Hydra finds plugins in the ``hydra_plugins`` namespace package and imports each of them at every start,
so this module stays light: the work is in ``attnseq.training.study``, imported when a sweep starts.
"""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig


class StudySweeper(Sweeper):
    """Optuna's ask/tell over the study in ``storage`` (an SQLAlchemy URL; null: this process's memory),
    ``n_trials`` in total across the workers, ``n_jobs`` trials at once in this worker (its launcher's).
    Every argument's default is in ``conf/hydra/sweeper/study.yaml``, the one place it is written."""

    def __init__(
        self,
        sampler: Any,
        direction: Any,
        storage: str | None,
        study_name: str | None,
        n_trials: int,
        n_jobs: int,
        params: DictConfig | None,
        heartbeat_interval_s: int,
        grace_period_s: int,
    ) -> None:
        from attnseq.training.study import StudySweep

        self.sweeper = StudySweep(
            sampler, direction, storage, study_name, n_trials, n_jobs, params, heartbeat_interval_s, grace_period_s
        )

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> None:
        return self.sweeper.sweep(arguments)
