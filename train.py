"""Train one configuration, or a sweep with -m. All the work is in ``attnseq.training.train``.

    python train.py                                   # the default: copy task, GRU, Bahdanau additive
    python train.py scorer=general decoder=luong model.heads=4
    python train.py -m scorer=none,additive,dot model.heads=1,4
    python train.py resume=<run id>                   # continue an interrupted run, into the same MLflow run
    python train.py --help                            # the config groups, their options and the keys
"""

from __future__ import annotations

from attnseq.runtime import Runtime  # isort: skip  (standard library only)

runtime = Runtime(keep_freed_memory=True)
if __name__ == "__main__":
    # first, before the heavy imports: SIGTERM and Ctrl-C exit 143 / 130 from here to the process's end
    # and, once the MLflow run exists, leave it KILLED with its newest checkpoint
    runtime.install()

import gc  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from attnseq.cli import (  # noqa: E402
    check_before_the_run,
    checked_command_line,
    config_help,
    hydra_answers_alone,
    is_sweep,
    user_errors,
    wants_help,
)
from attnseq.config import resolvers  # noqa: E402, F401  (registers ${attnseq.unique:})

CONF_DIR = Path(__file__).resolve().parent / "conf"
"""The config files beside this script (where @hydra.main reads them), wherever the package is installed."""


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    # the process's runtime, or, in a sweep's worker process, its own
    with Runtime.joined(keep_freed_memory=True) as job_runtime, job_runtime.job(), user_errors():
        job_runtime.configure(cfg)
        from attnseq.training.pipeline import train

        return train(cfg, job_runtime)


if __name__ == "__main__":
    sys.argv[1:] = runtime.job_command_line(sys.argv[1:])  # a data-parallel worker: its job, not the sweep
    with runtime:  # everything it set is undone at the exit
        if wants_help(sys.argv[1:]):  # answered from the config files: no torch, no MLflow
            print(config_help("train", CONF_DIR, argv=sys.argv[1:]))
            raise SystemExit(0)
        configs = checked_command_line("train", sys.argv[1:], CONF_DIR)  # a typo fails here, before torch loads
        with user_errors():
            runtime.configure_tracking(configs, sys.argv[1:])
        if hydra_answers_alone(sys.argv[1:]):  # --cfg job, --hydra-help: Hydra prints, no job runs
            main()
            raise SystemExit(0)
        if not is_sweep(sys.argv[1:]):  # a new SQLite store's schema made beside the imports, on another core
            runtime.prepare_store(configs[0])
        # the config is sound: the heavy imports now, before Hydra sets up logging, so that Lightning keeps
        # its own plain console lines (it adds its handler only while the root logger has none); without the
        # cyclic garbage collector, which would walk the growing heap ~8 times on the way (≈ 1 s of CPU), and
        # the ~600k objects they leave frozen out of its later full passes (another ≈ 0.8 s): they live to the end
        gc.disable()
        try:
            import attnseq.training.pipeline  # noqa: F401
        finally:
            gc.freeze()
            gc.enable()

        check_before_the_run("train", configs, sys.argv[1:])  # trainer.*, optimizer.*: before Hydra's run folder
        if is_sweep(sys.argv[1:]):  # its launcher writes and pickles the overrides: the jobs get the secrets
            sys.argv[1:] = runtime.secrets_to_jobs(sys.argv[1:])  # from the environment instead
        main()
