"""Train one configuration, or a sweep with -m. All the work is in ``attnseq.training.train``.

    python train.py                                   # the default: copy task, GRU, Bahdanau additive
    python train.py scorer=general decoder=luong model.heads=4
    python train.py -m scorer=none,additive,dot model.heads=1,4
    python train.py resume=<run id>                   # continue an interrupted run, into the same MLflow run
    python train.py --help                            # the config groups, their options and the keys
"""

from __future__ import annotations

# First, before the heavy imports: SIGTERM and Ctrl-C from here to the process's end exit 143 / 130
# and, once the MLflow run exists, leave it KILLED with its newest checkpoint (attnseq.training.signals).
from attnseq.training import signals  # isort: skip  (standard library only)

signals.install()
signals.pause_point("start")

import os  # noqa: E402
import sys  # noqa: E402

from attnseq.cli import config_help, hydra_errors, quiet_libraries, user_errors, wants_help  # noqa: E402

if __name__ == "__main__" and wants_help(sys.argv[1:]):  # answered from the config files: no torch, no MLflow
    print(config_help("train"))
    raise SystemExit(0)

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from attnseq.config import resolvers  # noqa: E402, F401  (registers ${attnseq.unique:})
from attnseq.training.pipeline import train  # noqa: E402


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    quiet_libraries()  # again here: a sweep's job may run in a worker process
    with user_errors():
        return train(cfg)


if __name__ == "__main__":
    quiet_libraries()
    # log_table appends by fetching the table first; its per-epoch download bar is noise here
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with hydra_errors("train"):
        main()
