"""``${attnseq.unique:}``, registered on import (train.py, evaluate.py, every joblib worker): ``<pid>-<4
random hex digits>``, the same for the whole process. The run and sweep folders end in it, so two
commands started in the same second, on one machine or two sharing a disk, never share a folder (a
sweep's jobs share its resolved value; data-parallel workers are given rank 0's folder)."""

from __future__ import annotations

import functools
import os
import secrets

from omegaconf import OmegaConf

UNIQUE_RESOLVER = "attnseq.unique"


@functools.cache
def process_unique() -> str:
    """A module-level function, not a lambda: a sweep launcher (joblib, submitit) pickles the resolvers."""
    return f"{os.getpid()}-{secrets.token_hex(2)}"


if not OmegaConf.has_resolver(UNIQUE_RESOLVER):
    OmegaConf.register_new_resolver(UNIQUE_RESOLVER, process_unique, use_cache=True)
