"""Evaluate saved runs past their training lengths, check their attention counterfactually, and
compare them side by side. All the work is in ``attnseq.evaluation.evaluate``.

    python evaluate.py run_id=<id> eval.lengths=[1,80]
    python evaluate.py parent_run_id=<sweep parent id> eval.beam_size=4
"""

from __future__ import annotations

import os

import hydra
from omegaconf import DictConfig

from attnseq.cli import hydra_errors, quiet_libraries, user_errors
from attnseq.config import resolvers  # noqa: F401  (registers ${attnseq.unique:})
from attnseq.evaluation import evaluate


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    quiet_libraries()
    with user_errors():
        evaluate(cfg)


if __name__ == "__main__":
    quiet_libraries()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with hydra_errors("evaluate"):
        main()
