"""What the command-line entry points share: a user error is one clear message, not a traceback.

An ``AttnSeqError`` (bad config, bad data, unreachable store, NaN loss, …) is printed as
``error: <what is wrong>  Fix: <what to do>`` and the process exits with the error's code.
``HYDRA_FULL_ERROR=1`` shows the traceback instead. In a multirun the error is re-raised, so
Hydra records that job as failed and the sweep goes on with the others.

Hydra's own config errors — an option that does not exist (``scorer=dott``), a key that does not
(``modle.heads=2``), an override it cannot parse — happen before the task function runs; Hydra
prints them and exits 1. ``hydra_errors`` presents them the same way as ours instead: one
message, the closest existing option or key, exit code 2.
"""

from __future__ import annotations

import logging
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
from omegaconf import OmegaConf

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


# -- Hydra's own config errors ----------------------------------------------------------------------


class _HydraConfigError(BaseException):
    """Carries a Hydra config error past Hydra's reporting (which catches ``Exception``) to ``hydra_errors``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@contextmanager
def hydra_errors(config_name: str, conf_dir: Path = CONF_DIR) -> Iterator[None]:
    """Around a ``@hydra.main`` function's call: Hydra's config errors as ``ConfigError``s (exit 2).

    Hydra reports every error of composing the config through ``run_and_report`` (print, exit 1);
    while this is active, that function lets Hydra's config errors through to here instead. Other
    errors, ``--help`` and ``--cfg`` are Hydra's as before; ``HYDRA_FULL_ERROR=1`` shows Hydra's own
    report and traceback.
    """
    from hydra._internal import utils as hydra_utils

    original: Callable[[Callable[[], Any]], Any] = hydra_utils.run_and_report

    def run_and_report(func: Callable[[], Any]) -> Any:
        def composed() -> Any:
            try:
                return func()
            except HYDRA_CONFIG_ERRORS as error:
                if full_error():
                    raise
                raise _HydraConfigError(error) from error

        return original(composed)

    hydra_utils.run_and_report = run_and_report
    try:
        yield
    except _HydraConfigError as caught:
        report(as_config_error(caught.error, config_name, conf_dir))
    finally:
        hydra_utils.run_and_report = original


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
        match = closest(key, known_keys(config_name, conf_dir))
        value = re.search(r"use \+[^=\s]+=(.*)$", message, re.MULTILINE)
        if match:
            fix = f"use {match}={value.group(1)}." if value else f"use {match}."
        else:
            fix = (f"check the spelling (`python {config_name}.py --cfg job` prints every key); a key that is "
                   "new on purpose is added with +key=value.")
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
)
"""Beginnings of the messages Lightning logs through its ``rank_zero_info`` that attnseq's own
console lines replace."""
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _DropChatter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(LIBRARY_CHATTER)


_CHATTER_FILTER = _DropChatter()


def quiet_libraries() -> None:
    """Silence the known noise of the libraries, each at its source; idempotent.

    - Lightning's litlogger tip and its "`Trainer.fit` stopped" line: dropped by a filter on the
      loggers Lightning prints them through (its other messages stay);
    - the ``LeafSpec`` FutureWarning: Lightning's own ``_pytree`` calls torch's deprecated ``LeafSpec()``
      (Lightning's bug, nothing attnseq does); ignored for that message from that module only;
    - MLflow's database INFO lines (creating and migrating the SQLite schema, through MLflow's logger
      and alembic's): those loggers at WARNING.
    """
    for name in RANK_ZERO_LOGGERS:
        rank_zero = logging.getLogger(name)
        if _CHATTER_FILTER not in rank_zero.filters:
            rank_zero.addFilter(_CHATTER_FILTER)
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )
    for name in ("mlflow.store.db.utils", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


# -- --help: attnseq.config.help (the typed config's field descriptions) -----------------------------

from attnseq.config.help import HELP_FLAGS, config_help, wants_help  # noqa: E402, F401
