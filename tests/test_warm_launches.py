"""The warm interpreter (``tests/zygote.py``) runs a script as a fresh ``python <script>`` would: the same
arguments, folder, environment, standard input, output, exit code and death by signal; a launch past
its timeout is killed; a launch that changes a variable read at start gets a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import _warm_interpreter, clean_env, run_cli, user_env
from zygote import differs_at_startup

PROBE = """\
import os, signal, sys, time
print("argv", sys.argv[1:])
print("cwd", os.getcwd())
print("env", os.environ.get("PROBE_VALUE"), "HYDRA_FULL_ERROR" in os.environ)
print("path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
print("main", __name__, os.path.basename(__file__))
print("stdin", sys.stdin.read())
print("to stderr\\r\\nwith a carriage return\\r", file=sys.stderr)
if sys.argv[1] == "signal":
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGTERM)
if sys.argv[1] == "sleep":
    time.sleep(60)
raise SystemExit(int(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def warm():
    interpreter = _warm_interpreter()
    assert interpreter is not None, "the warm interpreter did not start"
    return interpreter


@pytest.fixture
def probe(tmp_path) -> Path:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return script


def fresh_run(script: Path, args: list[str], cwd: Path, env: dict, stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [["exit", "3"], ["exit", "0"], ["signal", "0"]])
def test_a_warm_launch_is_what_a_fresh_one_is(warm, probe, tmp_path, args):
    env = user_env(PROBE_VALUE="here é")  # and without the server's HYDRA_FULL_ERROR
    work = tmp_path / "work"
    work.mkdir()
    warm_proc = warm.run(probe, tuple(args), work, env, "what the test typed\n", timeout=60)
    fresh_proc = fresh_run(probe, args, work, env, "what the test typed\n")
    assert (warm_proc.returncode, warm_proc.stdout, warm_proc.stderr) == (
        fresh_proc.returncode, fresh_proc.stdout, fresh_proc.stderr)
    assert warm_proc.returncode == (-15 if args[0] == "signal" else int(args[1]))
    assert f"argv {args!r}" in warm_proc.stdout and "env here é False" in warm_proc.stdout
    assert "main __main__ probe.py" in warm_proc.stdout and "path0 True" in warm_proc.stdout
    assert warm_proc.cpu_s > 0


def test_a_warm_launch_past_its_timeout_is_killed(warm, probe, tmp_path):
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        warm.run(probe, ("sleep", "0"), tmp_path, clean_env(), "", timeout=5)
    assert "argv ['sleep', '0']" in raised.value.output
    assert time.monotonic() - started < 55  # not the script's 60 s: it was killed


def test_a_refused_training_reads_the_same_warm_and_fresh(warm, tmp_path):
    warm_proc = run_cli(tmp_path, "scorer=dott", env=user_env())
    fresh_proc = run_cli(tmp_path, "scorer=dott", env=user_env(), fresh=True)
    assert warm_proc.returncode == fresh_proc.returncode == 2
    assert (warm_proc.stdout, warm_proc.stderr) == (fresh_proc.stdout, fresh_proc.stderr)
    assert not (tmp_path / "outputs").exists()
    assert hasattr(warm_proc, "cpu_s") and not hasattr(fresh_proc, "cpu_s")  # each ran where it says


def test_only_the_variables_read_at_start_ask_for_a_fresh_interpreter():
    base = clean_env()
    assert not differs_at_startup(base, dict(base))
    assert not differs_at_startup(base, base | {"MLFLOW_TRACKING_PASSWORD": "x", "ATTNSEQ_PAUSE_AT": "held"})
    for variable in ("OMP_NUM_THREADS", "PYTHONPATH", "MALLOC_ARENA_MAX", "LC_ALL", "TMPDIR"):
        assert differs_at_startup(base, base | {variable: base.get(variable, "") + "-changed"}), variable
    assert differs_at_startup(base | {"PYTHONHASHSEED": "1"}, {k: v for k, v in base.items() if k != "PYTHONHASHSEED"})
