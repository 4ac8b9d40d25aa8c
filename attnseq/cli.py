"""What the command-line entry points share: a user error is one clear message, not a traceback.

An ``AttnSeqError`` (bad config, bad data, unreachable store, NaN loss, …) is printed as
``error: <what is wrong>  Fix: <what to do>`` and the process exits with the error's code.
``HYDRA_FULL_ERROR=1`` shows the traceback instead. In a multirun the error is re-raised, so
Hydra records that job as failed and the sweep goes on with the others.

Hydra's own config errors — an option that does not exist (``scorer=dott``), a key that does not
(``modle.heads=2``), an override it cannot parse — are found before Hydra runs and before torch,
Lightning or MLflow load: ``checked_command_line`` composes the command line with Hydra's compose
API and tells them the same way as ours (one message, the closest option or key, exit code 2).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from attnseq.errors import AttnSeqError, ConfigError

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
HYDRA_CONFIG_ERRORS = (MissingConfigException, ConfigCompositionException, OverrideParseException)


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def full_error() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def report(error: AttnSeqError) -> None:
    print(f"error: {error}", file=sys.stderr, flush=True)
    raise SystemExit(error.exit_code) from None


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except AttnSeqError as error:
        if full_error() or in_multirun():
            raise
        report(error)


# -- Hydra's own config errors, before Hydra runs -----------------------------------------------------

HYDRA_FLAGS_WITH_VALUE = ("--cfg", "-c", "--package", "-p")
"""Hydra's flags that take a value and leave the config as the command line composes it."""
HYDRA_FLAGS_ALONE = ("--multirun", "-m", "--resolve")
MAX_COMPOSED_JOBS = 64
"""A sweep up to this many jobs is composed job by job; a larger one, each value of each swept key once."""


def command_line_overrides(argv: list[str]) -> tuple[list[str], bool] | None:
    """The overrides of a command line and whether it is a sweep (``-m``); None when it has a flag
    that changes which config is composed (``--config-name``, ``--experimental-rerun``, ``--info``, …),
    which Hydra then composes and reports alone."""
    overrides, multirun, arguments = [], False, iter(argv)
    for argument in arguments:
        flag, _, value = argument.partition("=") if argument.startswith("--") else (argument, "", "")
        if flag in HYDRA_FLAGS_WITH_VALUE:
            if not value:
                next(arguments, None)
        elif flag in HYDRA_FLAGS_ALONE:
            multirun = multirun or flag in ("--multirun", "-m")
        elif argument.startswith("-"):
            return None
        else:
            overrides.append(argument)
    return overrides, multirun


HYDRA_ANSWERS_ALONE = ("--cfg", "-c", "--hydra-help", "--info", "-i", "--shell-completion", "-sc")
"""Hydra's flags that print something (the config, its help, its info) and run no job."""


def hydra_answers_alone(argv: list[str]) -> bool:
    """A command line Hydra answers without running the job (``--cfg job``, ``--hydra-help``, …): no
    heavy import is needed for it."""
    return any(argument.partition("=")[0] in HYDRA_ANSWERS_ALONE for argument in argv)


def is_sweep(argv: list[str]) -> bool:
    """A command line that starts a multirun (``-m``, ``--multirun``)."""
    return any(argument in ("-m", "--multirun") for argument in argv)


def compose_command_line(config_name: str, argv: list[str], conf_dir: Path = CONF_DIR) -> list[DictConfig]:
    """The config(s) the command line composes, with Hydra's public compose API and nothing written
    to disk: one, or a sweep's jobs. Hydra's composition errors are raised as Hydra raises them."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = command_line_overrides(argv)
    if parsed is None:
        return []
    overrides, multirun = parsed
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3", job_name=config_name):
        from hydra.core.global_hydra import GlobalHydra

        options = GlobalHydra.instance().config_loader().get_group_options  # a group's options: glob(*)
        jobs = sweep_jobs(OverridesParser.create().parse_overrides(overrides), options) if multirun else [overrides]
        return [compose(config_name, overrides=job) for job in jobs]


def sweep_jobs(overrides: list[Any], options: Callable[[str], list[str]] | None = None) -> list[list[str]]:
    """The override lists of a sweep's jobs: every combination of the swept values (``a,b``,
    ``range(1,4)``, ``glob(*)`` over the group's ``options``) up to ``MAX_COMPOSED_JOBS`` jobs, else each
    swept value once (the other keys at their first value). A sweeper's search space (``interval(0,1)``,
    ``hydra.sweeper.params``) is the sweeper's to sample; those keys are left at the config's value."""
    from hydra.core.override_parser.types import ValueType

    choices = []  # per override, in the command line's order: its one value, or the swept ones
    for override in overrides:
        key = override.get_key_element()
        if not override.is_sweep_override():
            choices.append([override.input_line])
        elif override.value_type == ValueType.GLOB_CHOICE_SWEEP:  # a group's options, as Hydra's sweeper lists them
            names = sorted(options(override.key_or_group)) if options is not None else []
            choices.append([f"{key}={name}" for name in override.value().filter(names)])
        elif override.is_choice_sweep() or override.is_range_sweep():
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
    if math.prod(len(values) for values in choices) <= MAX_COMPOSED_JOBS:
        return [list(job) for job in itertools.product(*choices)]
    firsts = [values[0] for values in choices]
    jobs = [firsts]
    for index, values in enumerate(choices):
        jobs += [firsts[:index] + [value] + firsts[index + 1:] for value in values[1:]]
    return jobs


def checked_command_line(config_name: str, argv: list[str], conf_dir: Path = CONF_DIR) -> list[DictConfig]:
    """The command line's config(s), composed before anything heavy is imported: a Hydra
    composition error (``scorer=dott``, ``modle.heads=2``, an override that does not parse, a ``+key``
    that exists) is told as a ``ConfigError`` (exit 2, no traceback; ``HYDRA_FULL_ERROR=1``: raised)."""
    try:
        configs = compose_command_line(config_name, argv, conf_dir)
    except HYDRA_CONFIG_ERRORS as error:
        if full_error():
            raise
        report(as_config_error(error, config_name, conf_dir))
    parsed = command_line_overrides(argv)
    if configs and parsed is not None and parsed[1]:
        with user_errors():
            check_sweeper(config_name, parsed[0], conf_dir)
    if configs:
        # the typed config's stage one, still before torch, Lightning or MLflow load: the one run's, or every
        # job's of a sweep, so that a bad value stops the sweep before any job runs or any run is recorded
        from attnseq.config import validate_evaluate, validate_train, validate_translate

        validate = {"train": validate_train, "translate": validate_translate}.get(config_name, validate_evaluate)
        with user_errors():
            check_every_job(validate, configs, added_keys(parsed[0]) if parsed is not None else set())
    return configs


def check_every_job(check: Callable[[DictConfig], object], configs: list[DictConfig],
                    added: set[str] = frozenset()) -> None:
    """``check`` on every config (one run's, or a sweep's jobs), the ``ConfigError`` of all of them raised
    at once: each problem once, however many jobs share it (``-m scorer=dot,additive model.heads=-1``
    names model.heads once), and one that only some jobs have (``-m model.heads=1,-1``) too; a fix's
    example for one of the ``added`` keys keeps its ``+`` (``with_added``)."""
    from attnseq.problems import raise_all

    problems: list[ConfigError] = []
    for config in configs:
        try:
            check(config)
        except ConfigError as error:
            for problem in (with_added(p, added) for p in getattr(error, "problems", None) or [error]):
                if all((problem.problem, problem.fix) != (seen.problem, seen.fix) for seen in problems):
                    problems.append(problem)
    raise_all(problems)


def check_sweeper(config_name: str, overrides: list[str], conf_dir: Path = CONF_DIR) -> None:
    """A sweep's sweeper settings, before anything heavy: a shared Optuna study's storage opens, its name,
    total of trials and heartbeat times make sense (``attnseq.training.study.check_study``)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from attnseq.training.study import check_study

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3", job_name=config_name):
        from hydra.core.global_hydra import GlobalHydra

        options = GlobalHydra.instance().config_loader().get_group_options
        first = sweep_jobs(OverridesParser.create().parse_overrides(overrides), options)[0]
        sweeper = compose(config_name, overrides=first, return_hydra_config=True).hydra.sweeper
    try:
        settings = OmegaConf.to_container(sweeper, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation only Hydra's run resolves: the sweeper checks itself then
        return
    check_study(settings)


OVERRIDE = re.compile(r"^(?:\+{0,2}[A-Za-z_][\w.@/-]*=|~[A-Za-z_][\w.@/-]*(?:=|$))")
"""A Hydra override (``key=value``, ``+key=value``, ``~key``): what a command that also takes free text
(``translate.py``'s sources) reads as a setting."""


def overrides_and_texts(argv: list[str]) -> tuple[list[str], list[str]]:
    """A command line's overrides and its free texts: an argument that reads as an override is one,
    and so is ``--help``; every other argument, and every one after ``--``, is a text."""
    overrides: list[str] = []
    texts: list[str] = []
    arguments = iter(argv)
    for argument in arguments:
        if argument == "--":
            texts += list(arguments)
        elif OVERRIDE.match(argument) or argument in HELP_FLAGS:
            overrides.append(argument)
        else:
            texts.append(argument)
    return overrides, texts


def check_before_the_run(config_name: str, configs: list[DictConfig], argv: list[str]) -> None:
    """The checks that need torch, Lightning or MLflow, for one run or every job of a sweep, once they are
    imported and before Hydra makes the run's (or the sweep's) folder, so a bad value there leaves nothing
    on disk either: for training the keys handed on to Lightning and torch (``trainer.*``, ``optimizer.*``,
    ``scheduler.*``), the learning rate each epoch and a TSV corpus; for evaluation the filter's search
    syntax and the store, experiment, sweep or runs chosen (one that is not there). A resumed run (its own
    stored config) is checked as it starts, and so is a value a sweeper samples (``interval(0,1)``, left at
    the config's value here)."""
    if command_line_overrides(argv) is None:
        return
    jobs = [config for config in configs if not config.get("resume")]
    if not jobs:
        return
    if config_name == "evaluate":
        from attnseq.evaluation.trained_runs import check_selection
        from attnseq.evaluation.validation import check_config

        def check(config: DictConfig) -> None:
            check_selection(check_config(config))
    else:
        from attnseq.config import validate_train
        from attnseq.training.build import check_with_libraries

        def check(config: DictConfig) -> None:
            check_with_libraries(validate_train(config))

    with user_errors():
        check_every_job(check, jobs, added_keys(command_line_overrides(argv)[0]))


def added_keys(overrides: list[str]) -> set[str]:
    """The keys a command line adds with one ``+`` (``+optimizer.fused=true``): keys the config files lack."""
    return {o[1:].split("=", 1)[0] for o in overrides if o.startswith("+") and not o.startswith("++")}


def with_added(problem: ConfigError, added: set[str]) -> ConfigError:
    """``problem``, its fix suggesting a key the command line added (``added_keys``) with the ``+``: pasted
    without it (``optimizer.fused=true``), Hydra refuses a key the config files lack."""
    fix = problem.fix
    for key in added:
        fix = re.sub(rf"(?<![\w.+~-]){re.escape(key)}=", f"+{key}=", fix)
    return problem if fix == problem.fix else ConfigError(problem.problem, fix)


def as_config_error(error: Exception, config_name: str, conf_dir: Path = CONF_DIR) -> ConfigError:
    """One of Hydra's config errors told as what is wrong and what to do, with the closest option or key."""
    from attnseq.config import closest

    message = str(error)
    first_line = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    if isinstance(error, MissingConfigException) and getattr(error, "options", None) is not None:
        group, _, option = str(error.missing_cfg_file).rpartition("/")
        options = list(error.options)
        match = closest(option, options)
        return ConfigError(
            f"{group}={option} is not an option: Hydra could not find '{error.missing_cfg_file}' "
            f"(there is no {conf_dir.name}/{group}/{option}.yaml). Available options in '{group}': "
            f"{', '.join(options)}." + (f" Did you mean {group}={match}?" if match else ""),
            f"use one of them, e.g. {group}={match or options[0]}.",
        )
    if isinstance(error, OverrideParseException):
        return ConfigError(
            f"an override cannot be parsed: {' '.join(message.split(chr(10))[:2])}.",
            "write key=value (quote a value with spaces or special characters: key='a b'); lists are "
            "[1,2]. See https://hydra.cc/docs/advanced/override_grammar/basic/",
        )
    missing = re.search(r"Could not override '([^']+)'", message) or re.search(
        r"Could not delete from config\. '([^']+)'", message
    )
    if missing:
        key = missing.group(1)
        match = closest_key(key, known_keys(config_name, conf_dir))
        value = re.search(r"use \+[^=\s]+=(.*)$", message, re.MULTILINE)
        if match:
            fix = f"use {match}={value.group(1)}." if value else f"use {match}."
        else:
            fix = (f"check the spelling (`python {config_name}.py --cfg job` prints every key); a key that is "
                   f"new on purpose is added with +: +{key}={value.group(1) if value else '<value>'}.")
        return ConfigError(
            f"{key} is not a key of the config ({config_name}.yaml and its groups)."
            + (f" Did you mean {match}?" if match else ""),
            fix,
        )
    exists = re.search(r"An item is already at '([\w./-]+)'", message)
    if exists:
        key = exists.group(1)
        return ConfigError(
            f"+{key} adds a key, but {key} is already in the config.",
            f"drop the +: {key}=<value>.",
        )
    return ConfigError(f"the config cannot be composed: {first_line}",
                       f"check the overrides; `python {config_name}.py --cfg job` prints the composed config.")


def closest_key(key: str, known: list[str]) -> str | None:
    """The known key ``key`` is most likely a typo of: in a group that exists, one of the group's own
    keys by its name (``trainer.foo`` is no typo of ``trainer.precision`` nor of ``trainer``); else
    any key by its dotted name (``modle.heads`` → ``model.heads``)."""
    from attnseq.config import closest

    group, _, name = key.rpartition(".")
    if group and group in known:
        siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == group}
        match = closest(name, list(siblings))
        return siblings[match] if match else None
    return closest(key, [k for k in known if not key.startswith(f"{k}.")])


def known_keys(config_name: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """Every dotted key the primary config and its groups' files define (for "did you mean")."""
    keys: set[str] = set()

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.items():
            if key == "defaults" or (not prefix and key == "hydra"):
                continue
            keys.add(f"{prefix}{key}")
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")

    primary = OmegaConf.to_container(OmegaConf.load(conf_dir / f"{config_name}.yaml"))
    walk(primary, "")
    groups = [next(iter(entry)) for entry in primary.get("defaults", []) if isinstance(entry, dict)]
    for group in groups:
        if group.startswith(("override ", "hydra")):
            continue
        for path in sorted((conf_dir / group).glob("**/*.yaml")):
            global_package = "_global_" in path.read_text().split("\n", 1)[0]
            content = OmegaConf.to_container(OmegaConf.load(path))
            if isinstance(content, dict):
                walk({k: v for k, v in content.items() if k != "hydra"}, "" if global_package else f"{group}.")
    return sorted(keys)


# -- quiet libraries -------------------------------------------------------------------------------

LIBRARY_CHATTER = (
    "💡 Tip:",  # Lightning advertises its cloud logger on every Trainer
    "`Trainer.fit` stopped:",  # printed on the progress bar's line; the epoch lines already say it
    "GPU available:", "TPU available:",  # the start line names the device
    "`Trainer(val_check_interval=",  # "…validation will run at the end of the training epoch"
)
"""Beginnings of the messages Lightning logs through its ``rank_zero_info`` that attnseq's own
console lines replace."""
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _DropChatter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(LIBRARY_CHATTER)


_CHATTER_FILTER = _DropChatter()
SIGNAL_LOGGER = "lightning.pytorch.trainer.connectors.signal_connector"
"""Where Lightning logs "[rank: N] Received SIGTERM: 15" when its handler runs: attnseq's handler calls it
with SIGTERM to stop the loop after Ctrl-C too, and says itself which signal stopped the run."""


class _DropSignalNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Received SIGTERM:" not in str(record.msg)


_SIGNAL_FILTER = _DropSignalNotice()


class _DropLockedStore(logging.Filter):
    """MLflow logs every "database is locked" with its traceback before raising it; attnseq waits
    for the lock and reports a store that stays locked itself (``tracking.retry.store_locked``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from attnseq.tracking.retry import store_locked

        return not (record.exc_info and record.exc_info[1] is not None and store_locked(record.exc_info[1]))


_LOCKED_FILTER = _DropLockedStore()


def quiet_libraries() -> Callable[[], None]:
    """Silence the known noise of the libraries, each at its source; returns what undoes it (the
    runtime calls both, ``attnseq.runtime``).

    - Lightning's litlogger tip and its "`Trainer.fit` stopped" line: dropped by a filter on the
      loggers Lightning prints them through (its other messages stay); its "Received SIGTERM: 15" when a
      signal stops the loop, which it also says after a Ctrl-C (attnseq tells its handler with SIGTERM):
      the "Interrupted (Ctrl-C | SIGTERM)" line names the signal instead;
    - the ``LeafSpec`` FutureWarning: Lightning's own ``_pytree`` calls torch's deprecated ``LeafSpec()``
      (Lightning's bug, nothing attnseq does); ignored for that message from that module only;
    - Lightning's "recommended to use ``self.log(..., sync_dist=True)``" in data-parallel training, once per
      metric: the metrics suite reduces its own states across the processes (every validation sequence
      counted once, tests/test_scaling.py), and the learning rate is the same on every rank;
    - Lightning's "The `srun` command is available on your system but is not used" hint, on every run
      of a machine that has Slurm installed: attnseq's Slurm jobs run under srun (its submitit launcher),
      and a multi-node training started by hand that waits for its nodes says so itself
      (``attnseq.lifecycle.nodes.NodesJoining``);
    - sacreBLEU's INFO lines, nine per pair of groups in a comparison's paired bootstrap ("Pre-computing
      sacrebleu statistics", "Performing paired bootstrap resampling test"): its logger at WARNING (the
      comparison says once what it is doing);
    - MLflow's database INFO lines (creating and migrating the SQLite schema, through MLflow's logger
      and alembic's): those loggers at WARNING; its traceback of a locked SQLite store, which attnseq
      waits for and reports itself: dropped by a filter on that logger.
    """
    filtered = [logging.getLogger(name) for name in RANK_ZERO_LOGGERS]
    filtered = [logger for logger in filtered if _CHATTER_FILTER not in logger.filters]
    for logger in filtered:
        logger.addFilter(_CHATTER_FILTER)
    signal_logger = logging.getLogger(SIGNAL_LOGGER)
    signal_filtered = _SIGNAL_FILTER not in signal_logger.filters
    if signal_filtered:
        signal_logger.addFilter(_SIGNAL_FILTER)
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )
    ignored = warnings.filters[0]
    warnings.filterwarnings("ignore", message=r"It is recommended to use `self\.log\('[^']*', \.\.\., sync_dist=True")
    unsynced = warnings.filters[0]
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")
    srun_hint = warnings.filters[0]
    levels = {name: logging.getLogger(name).level for name in ("mlflow.store.db.utils", "alembic", "sacrebleu")}
    for name in levels:
        logging.getLogger(name).setLevel(logging.WARNING)
    database = logging.getLogger("mlflow.store.db.utils")
    locked_filtered = _LOCKED_FILTER not in database.filters
    if locked_filtered:
        database.addFilter(_LOCKED_FILTER)

    def undo() -> None:
        for logger in filtered:
            logger.removeFilter(_CHATTER_FILTER)
        for added in (ignored, unsynced, srun_hint):
            if added in warnings.filters:
                warnings.filters.remove(added)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        if locked_filtered:
            database.removeFilter(_LOCKED_FILTER)
        if signal_filtered:
            signal_logger.removeFilter(_SIGNAL_FILTER)

    return undo


# -- --help: attnseq.cli_help (the typed config's field descriptions) ------------------------------

from attnseq.cli_help import HELP_FLAGS, config_help, wants_help  # noqa: E402, F401
