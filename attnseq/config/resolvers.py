"""``${attnseq.unique:}``, registered on import (train.py, evaluate.py, every joblib worker): ``<pid>-<4
random hex digits>``, the same for the whole process. The run and sweep folders end in it, so two
commands started in the same second, on one machine or two sharing a disk, never share a folder (a
sweep's jobs share its resolved value; data-parallel workers are given rank 0's folder)."""

from __future__ import annotations

import functools
import os
import secrets

from omegaconf import OmegaConf

if not OmegaConf.has_resolver("attnseq.unique"):
    OmegaConf.register_new_resolver("attnseq.unique", functools.cache(lambda: f"{os.getpid()}-{secrets.token_hex(2)}"),
                                    use_cache=True)
