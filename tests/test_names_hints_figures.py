"""Issue 24, point 6 and its "smaller" list: runs named so a list of them reads (a sweep parent by what
it sweeps and when, runs of one config told apart), fixes that paste into a shell as printed, and a
training's figures in its folder beside its checkpoints.

The fixes are collected from real failing CLI calls (config errors: exit 2 before torch loads, about a
second each); each is then pasted back as a user would: split as the shell splits it, its overrides
parsed by Hydra's grammar and fed to the same validator in-process. No wording is pinned."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from cli_helpers import EVALUATE_PY, TRAIN_PY, explain, run_cli, user_env  # noqa: E402  (tests/ on sys.path)
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from attnseq.cli import HYDRA_CONFIG_ERRORS, compose_command_line
from attnseq.config import validate_train
from attnseq.errors import ConfigError
from attnseq.evaluation.validation import check_config
from attnseq.tracking import paths
from attnseq.training.build import check_with_libraries
from attnseq.training.identity import run_identity
from attnseq.training.sweep import PARENT_RUN_ENV, SWEEP_KEYS_ENV, sweep_name

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


# -- names -------------------------------------------------------------------------------------
@pytest.fixture
def outside_a_sweep(monkeypatch):
    monkeypatch.delenv(PARENT_RUN_ENV, raising=False)
    monkeypatch.delenv(SWEEP_KEYS_ENV, raising=False)


def test_two_runs_of_one_config_get_different_names_that_say_their_choices_and_seed(outside_a_sweep):
    [cfg] = compose_command_line("train", ["seed=7"], CONF_DIR)
    first = run_identity(cfg, now=datetime(2026, 12, 2, 11, 9, 40))
    second = run_identity(cfg, now=datetime(2026, 12, 2, 11, 9, 58))
    assert first.name != second.name
    for identity in (first, second):
        assert identity.tags["attnseq.choices"] in identity.name  # copy-gru-additive-bahdanau-h1
        assert re.search(r"\bseed 7\b", identity.name), identity.name
    [named] = compose_command_line("train", ["mlflow.run_name=my baseline"], CONF_DIR)
    assert run_identity(named).name == "my baseline"  # a name given is kept as given


def test_a_sweep_parent_is_named_by_what_it_sweeps_and_when():
    config = OmegaConf.create({"hydra": {
        "overrides": {"task": ["scorer=additive,dot,general", "model.heads=1,4", "seed=3", "db.password=a,b"]},
        "sweeper": {"params": {"optimizer.lr": "interval(0.0001, 0.01)"}},
    }})
    name = sweep_name(config, datetime(2026, 12, 2, 11, 9, 40))
    for swept in ("scorer=additive,dot,general", "model.heads=1,4", "optimizer.lr", "2026-12-02 11:09"):
        assert swept in name, name
    assert "seed" not in name and "a,b" not in name, name  # a fixed override is no part of it; a secret is masked
    later = sweep_name(config, datetime(2026, 12, 2, 11, 10, 40))
    assert later != name


# -- fixes that paste ----------------------------------------------------------------------------
FAILING = [  # (script, the bad override first, then the rest of the command line)
    (TRAIN_PY, ["model.dropout=abc"]),
    (TRAIN_PY, ["dataset.eval_lengths=[10,5]"]),
    (TRAIN_PY, ["dataset.train_lengths=[1,100000]"]),
    (TRAIN_PY, ["modle.heads=2"]),
    (TRAIN_PY, ["scorer=dott"]),
    (TRAIN_PY, ["checkpoint.monitor=val/loss"]),
    (TRAIN_PY, ["~model.dropout"]),
    (TRAIN_PY, ["optimized_metric=val/acc_bets"]),
    (TRAIN_PY, ["+model.dropuot=0.1"]),
    (TRAIN_PY, ["+optimizer.fused=maybe"]),  # a key handed on to torch, added with +: the fix keeps the +
    (TRAIN_PY, ["encoder.cell=rnn"]),
    (TRAIN_PY, ["model.heads=3"]),
    (EVALUATE_PY, ["eval.lengths=[5,1]", "run_id=0123456789abcdef"]),
]
OVERRIDE = re.compile(r"[~+]{0,2}[a-z_][\w-]*(\.[\w/-]+)*=.*|~[a-z_][\w-]*(\.[\w/-]+)*")
"""A word of a fix that is a Hydra override: ``key=value``, or ``~key`` (drop it)."""


def suggested_overrides(fix: str) -> list[str]:
    """The overrides a fix suggests, each word as the shell splits the line; a sentence's punctuation
    after a word (``… e.g. scorer=dot.``) is the sentence's. Templates (``<value>``, ``…``) are left out."""
    words = [re.sub(r"[.,;]$", "", word) for word in shlex.split(fix)]  # raises on unbalanced quotes
    words = [w[:-1] if w.endswith(")") and w.count("(") < w.count(")") else w for w in words]
    return [w for w in words if OVERRIDE.fullmatch(w) and not re.search(r"<|…|\.\.\.", w)]


def pasted(command: list[str], suggestion: str) -> list[list[str]]:
    """The command lines a user makes of a suggestion: in place of the override of its key (or of
    the bad one), or added; a ``~key`` drops the key's override."""
    key = suggestion.split("=", 1)[0].lstrip("+~")
    others = [o for o in command if o.split("=", 1)[0].lstrip("+~") != key]
    if suggestion.startswith("~") and "=" not in suggestion:
        return [others] if len(others) < len(command) else [[*command, suggestion]]
    return [[suggestion, *others]] if len(others) < len(command) else [[*command, suggestion],
                                                                       [suggestion, *command[1:]]]


def still_wrong(script: Path, overrides: list[str]) -> str | None:
    """What the validators (the CLI's own, in-process: for training, both stages) still reject in these
    overrides; None: nothing."""
    name = script.stem
    try:
        [cfg] = compose_command_line(name, overrides, CONF_DIR)
        if name == "train":
            check_with_libraries(validate_train(cfg))
        else:
            check_config(cfg)
    except (ConfigError, *HYDRA_CONFIG_ERRORS) as error:
        return str(error)
    return None


@pytest.mark.parametrize(("script", "command"), FAILING, ids=[" ".join(c) for _, c in FAILING])
def test_every_suggested_fix_pastes_into_a_shell_and_fixes_the_command(script, command, tmp_path):
    folder = [f"hydra.run.dir={tmp_path}/out", f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db"]
    proc = run_cli(tmp_path, *command, *folder, script=script, env=user_env(), timeout=60)
    assert proc.returncode == 2, explain(proc)
    fixes = [line.split("Fix:", 1)[1].strip() for line in proc.stderr.splitlines() if "Fix:" in line]
    assert fixes, explain(proc)
    assert_pasted_they_fix(script, command, fixes)
    assert list(tmp_path.iterdir()) == []


def assert_pasted_they_fix(script: Path, command: list[str], fixes: list[str]) -> None:
    suggestions = [s for fix in fixes for s in suggested_overrides(fix)]
    assert suggestions, fixes  # every one of these errors suggests a value to paste
    for suggestion in suggestions:
        OverridesParser.create().parse_overrides([suggestion])  # Hydra's grammar takes it as one word
        tried = {" ".join(line): still_wrong(script, line) for line in pasted(command, suggestion)}
        assert None in tried.values(), (suggestion, fixes, tried)


def test_the_filter_a_fix_suggests_pastes_into_a_shell_and_parses():
    """The filter's own check runs after torch loads (``evaluate.py``: seconds), so its fix is read in-process."""
    command = ["filter='params.scorer = dot'", "run_id=null", "experiment_name=x"]
    assert still_wrong(EVALUATE_PY, command) is not None
    [cfg] = compose_command_line("evaluate", command, CONF_DIR)
    with pytest.raises(ConfigError) as caught:
        check_config(cfg)
    assert_pasted_they_fix(EVALUATE_PY, command, [caught.value.fix])


def test_the_command_that_lists_a_stores_runs_pastes_and_lists_them(tiny_run):
    """A run id the store does not hold: the fix names a command that lists the store's runs, and that
    command, pasted as printed into a shell (the environment's ``mlflow`` on the PATH, no MLflow variable
    set), lists the run."""
    from attnseq.evaluation.trained_runs import get_run
    from attnseq.tracking.client import TrackingClient

    with pytest.raises(ConfigError) as caught:
        get_run(TrackingClient(tiny_run.uri), "0123456789abcdef")
    [command] = re.findall(r"`([^`]*mlflow runs list[^`]*)`", caught.value.fix)
    env = user_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    listed = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr
    assert tiny_run.runs[0].info.run_id in listed.stdout


# -- figures beside the checkpoints ----------------------------------------------------------------
def test_the_runs_figures_lie_beside_its_checkpoints_as_the_store_holds_them(tiny_run, tmp_path):
    folder = tiny_run.root / "out"  # Hydra's run folder (conftest)
    [run] = tiny_run.runs
    assert (folder / paths.LAST_CHECKPOINT).is_file()
    figures = [paths.LENGTH_FIGURE, *(paths.heatmap_file(label) for label in ("short", "medium", "long")),
               paths.best_heatmap_file("long")]
    for figure in figures:
        local = folder / figure
        assert local.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), figure
        stored = tiny_run.client.download_artifacts(run.info.run_id, figure, str(tmp_path))
        assert Path(stored).read_bytes() == local.read_bytes(), figure
    assert str(folder.resolve()) in tiny_run.proc.stdout.split("FINISHED", 1)[1]  # the summary names the folder


def test_a_glob_sweep_is_composed_over_the_groups_registered_options():
    """``-m scorer=glob(*,exclude=none)`` sweeps every scorer but the baseline, as Hydra's sweeper lists them."""
    from attnseq.attention import SCORERS

    configs = compose_command_line("train", ["-m", "scorer=glob(*,exclude=none)", "seed=0,1"], CONF_DIR)
    assert sorted((c.scorer.name, c.seed) for c in configs) == sorted((s, seed) for s in SCORERS for seed in (0, 1))


def test_a_glob_sweep_with_a_misspelt_key_is_told_before_any_job(tmp_path):
    """The command line's check composes a glob sweep's jobs too (it used to stop at Hydra's glob)."""
    proc = run_cli(tmp_path, "-m", "scorer=glob(*)", "modle.heads=2", f"hydra.sweep.dir={tmp_path}/multi",
                   env=user_env())
    assert proc.returncode == 2, explain(proc)
    assert "modle.heads" in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
    assert not (tmp_path / "multi").exists()
