"""Which code and runtime a run was made with: the commit, as MLflow's own source tags, and the
runtime facts that decide its numbers, as ``runtime.*`` params.

The same seed and config give identical metrics only with the same thread count and the same
versions (and device), so a run records those beside its config. They are params, not tags, so
the MLflow UI shows them as columns of the runs table and ``params.`runtime.threads` = '1'`` filters
by them. Their names are declared here, once.
"""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import torch
from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_GIT_DIRTY

CHECKOUT = Path(__file__).resolve().parents[2]

THREADS = "runtime.threads"
"""The process's intra-op CPU threads (``torch.get_num_threads()``) as it ran, also when ``threads`` was null."""
INTEROP_THREADS = "runtime.interop_threads"
DETERMINISTIC = "runtime.deterministic"
"""``torch.use_deterministic_algorithms`` as the run had it: ``true``, ``false`` or ``warn`` (warn only)."""
ACCELERATOR = "runtime.accelerator"
"""The kind of device the model ran on: ``cpu``, ``cuda``, ``mps``."""
DEVICE = "runtime.device"
"""Which one: the GPU's name, or the CPU's model with the vector instructions torch uses on it."""
PYTHON = "runtime.python"
CUDA = "runtime.cuda"
"""The CUDA version torch was built with; ``none`` for a CPU-only build."""
TORCH = "runtime.torch"
LIGHTNING = "runtime.lightning"
MLFLOW = "runtime.mlflow"
TORCHMETRICS = "runtime.torchmetrics"
HYDRA = "runtime.hydra"
NUMPY = "runtime.numpy"

DISTRIBUTIONS = {
    TORCH: ("torch",),
    LIGHTNING: ("lightning",),
    MLFLOW: ("mlflow", "mlflow-skinny"),
    TORCHMETRICS: ("torchmetrics",),
    HYDRA: ("hydra-core",),
    NUMPY: ("numpy",),
}
"""Each version param and the installed distributions that provide it, the first one found wins."""
UNCHANGED = "unchanged"


def git_commit(cwd: Path = CHECKOUT) -> tuple[str | None, bool]:
    """The checkout's commit and whether its tracked files have uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        return commit, bool(dirty)
    except (OSError, subprocess.SubprocessError):
        return None, False


def git_tags(cwd: Path = CHECKOUT) -> dict[str, str]:
    """``mlflow.source.git.commit`` and ``mlflow.source.git.dirty`` (``true``/``false``, as MLflow
    writes it); nothing outside a git checkout."""
    commit, dirty = git_commit(cwd)
    return {MLFLOW_GIT_COMMIT: commit, MLFLOW_GIT_DIRTY: str(dirty).lower()} if commit else {}


def runtime_params(device: torch.device) -> dict[str, str]:
    """The runtime facts of this process as they are now, for a model on ``device``: read them
    once the process is set up to run (threads set, deterministic algorithms switched on or off)."""
    if not torch.are_deterministic_algorithms_enabled():
        deterministic = "false"
    else:
        deterministic = "warn" if torch.is_deterministic_algorithms_warn_only_enabled() else "true"
    facts = {
        THREADS: str(torch.get_num_threads()),
        INTEROP_THREADS: str(torch.get_num_interop_threads()),
        DETERMINISTIC: deterministic,
        ACCELERATOR: device.type,
        DEVICE: device_name(device),
        PYTHON: platform.python_version(),
        CUDA: torch.version.cuda or "none",
    }
    return facts | {param: installed_version(names) for param, names in DISTRIBUTIONS.items()}


def installed_version(distributions: tuple[str, ...]) -> str:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"{cpu_model()} ({torch.backends.cpu.get_cpu_capability()})"
    return device.type


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``), else what ``platform`` knows of it."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def runtime_changes(recorded: Mapping[str, str], current: Mapping[str, str]) -> str:
    """The facts in ``current`` that ``recorded`` lacks or holds with another value, as
    ``runtime.threads=2; runtime.torch=2.13.0``; ``unchanged`` when there are none."""
    changed = [f"{key}={value}" for key, value in current.items() if recorded.get(key) != value]
    return "; ".join(changed) or UNCHANGED
