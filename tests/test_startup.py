"""Start-up: ``train.py --help`` answers from the config files alone, quickly; a training run records
how long after its process started its first training step began (``attnseq.first_step_s``).

The bound on --help is on the CPU time it takes, which a busy machine does not stretch the way it
stretches the wall-clock time; benchmarks/startup.py measures the real (wall-clock) figures."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from cli_helpers import REPO, TRAIN_PY, child_cpu_s, clean_env, explain

from attnseq.tracking import tags

HELP_BOUND_S = 3.0
HEAVY_MODULES = ("torch", "lightning", "mlflow", "matplotlib", "scipy")


def test_help_answers_within_the_bound():
    """On a quiet machine the wall-clock time of --help is its CPU time; the CPU time is what is
    bounded here, so a busy machine does not fail the test (importing torch alone takes ~2 s of CPU)."""
    proc, cpu_s = child_cpu_s(lambda: subprocess.run([sys.executable, str(TRAIN_PY), "--help"], cwd=REPO,
                                                     env=clean_env(), capture_output=True, text=True, timeout=120))
    assert proc.returncode == 0, explain(proc)
    assert "Config groups" in proc.stdout
    assert cpu_s < HELP_BOUND_S, cpu_s


@pytest.mark.parametrize("flags", [["--help"], ["--hydra-help"], ["--cfg", "job"]], ids=" ".join)
def test_help_imports_nothing_heavy(flags, tmp_path):
    """What makes --help fast: it is answered before torch, Lightning or MLflow is imported; so are
    Hydra's own answers that run no job (its help, the composed config)."""
    probe = (
        "import runpy, sys\n"
        f"sys.argv = [{str(TRAIN_PY)!r}, *{flags!r}, 'hydra.run.dir={tmp_path}/out']\n"
        "try:\n"
        f"    runpy.run_path({str(TRAIN_PY)!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('LOADED', sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, explain(proc)
    assert "LOADED []" in proc.stdout, proc.stdout[-2000:]


def test_process_age_counts_from_the_process_start():
    """A process that sleeps before importing the clock still counts the sleep; and it is never
    older than the time its parent has waited for it."""
    probe = "import time; time.sleep(1.0)\nfrom attnseq.training.startup import process_age_s\nprint(process_age_s())"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                          timeout=60)
    waited = time.monotonic() - started
    assert proc.returncode == 0, explain(proc)
    age = float(proc.stdout.split()[-1])
    assert 1.0 <= age <= waited + 0.05, (age, waited)


def test_run_records_its_first_step_time(tiny_run):
    """The tag exists and lies between the run's creation and its end, counted from the launch."""
    launched = tiny_run.launched
    [run] = tiny_run.runs
    first_step_s = float(run.data.tags[tags.FIRST_STEP_S])
    created_s = run.info.start_time / 1000 - launched
    ended_s = run.info.end_time / 1000 - launched
    assert 0 < created_s - 0.05 <= first_step_s <= ended_s, (created_s, first_step_s, ended_s)
