"""Where and from what a benchmark ran: the machine line and the commit its report names."""

from __future__ import annotations

import os
import platform

import torch
from cases import REPO

from attnseq.tracking.provenance import cpu_model, git_commit


def machine_line(device: str) -> str:
    import lightning
    import mlflow

    accelerator = f", GPU {torch.cuda.get_device_name()}" if device == "cuda" else ""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({cpu_model()}){accelerator}, device {device}, torch {torch.__version__} "
        f"({torch.backends.cpu.get_cpu_capability()}), torch.get_num_threads() = {torch.get_num_threads()}, "
        f"lightning {lightning.__version__}, mlflow {mlflow.__version__}, python {platform.python_version()}; "
        f"load average at the end {load}"
    )


def git_state() -> str:
    """The checkout's commit, ``+ uncommitted changes`` when its tracked files differ from it."""
    commit, dirty = git_commit(REPO)
    return "unknown" if commit is None else commit + (" + uncommitted changes" if dirty else "")
