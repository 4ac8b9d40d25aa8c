"""The config resolvers attnseq's yaml files use, registered when this module is imported.

``${attnseq.unique:}`` is ``<pid>-<4 random hex digits>``, the same for the whole process. The
run and sweep folders of ``conf/train.yaml`` and ``conf/evaluate.yaml`` end in it
(``outputs/<date>/<H-M-S>-<pid>-<hex>``), so two commands started in the same second, on one
machine or on two sharing a disk, never share a folder. Hydra copies a resolved value into every
job of a sweep, so a sweep's jobs share its folder; Lightning's data-parallel workers are given
rank 0's folder.
"""

from __future__ import annotations

import functools
import os
import secrets

from omegaconf import OmegaConf

UNIQUE_RESOLVER = "attnseq.unique"


@functools.cache
def process_unique() -> str:
    return f"{os.getpid()}-{secrets.token_hex(2)}"


def register_resolvers() -> None:
    if not OmegaConf.has_resolver(UNIQUE_RESOLVER):
        OmegaConf.register_new_resolver(UNIQUE_RESOLVER, process_unique, use_cache=True)


register_resolvers()  # on import: train.py, evaluate.py and every joblib worker (which imports the pipeline)
