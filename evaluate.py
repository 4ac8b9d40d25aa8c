"""Evaluate saved runs past their training lengths, check their attention counterfactually, and
compare them side by side. All the work is in ``attnseq.evaluation.evaluate``.

    python evaluate.py run_id=<id> eval.lengths=[1,80]
    python evaluate.py parent_run_id=<sweep parent id> eval.beam_size=4
    python evaluate.py --help                 # how to choose the runs, and every key with its meaning
"""

from __future__ import annotations

from attnseq.runtime import Runtime  # isort: skip  (standard library only)

runtime = Runtime()
if __name__ == "__main__":
    runtime.install()  # first, before the heavy imports (see train.py)

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from attnseq.cli import (  # noqa: E402
    check_before_the_run,
    checked_command_line,
    config_help,
    hydra_answers_alone,
    user_errors,
    wants_help,
)
from attnseq.config import resolvers  # noqa: E402, F401  (registers ${attnseq.unique:})

CONF_DIR = Path(__file__).resolve().parent / "conf"
"""The config files beside this script (where @hydra.main reads them), wherever the package is installed."""


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    with Runtime.joined() as job_runtime, user_errors():
        job_runtime.configure(cfg)
        from attnseq.evaluation import evaluate

        evaluate(cfg, job_runtime.signals)


if __name__ == "__main__":
    with runtime:  # everything it set is undone at the exit
        if wants_help(sys.argv[1:]):  # answered from the config files: no torch, no MLflow
            print(config_help("evaluate", CONF_DIR))
            raise SystemExit(0)
        configs = checked_command_line("evaluate", sys.argv[1:], CONF_DIR)  # a typo fails here, before torch loads
        with user_errors():
            runtime.configure_tracking(configs, sys.argv[1:])
        if hydra_answers_alone(sys.argv[1:]):  # --cfg job, --hydra-help: Hydra prints, no job runs
            main()
            raise SystemExit(0)
        check_before_the_run("evaluate", configs, sys.argv[1:])  # the filter's syntax: before Hydra's run folder
        main()
