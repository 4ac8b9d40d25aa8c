"""What the command-line entry points share: a user error is one clear message, not a traceback.

An ``AttnSeqError`` (bad config, bad data, unreachable store, NaN loss, …) is printed as
``error: <what is wrong>  Fix: <what to do>`` and the process exits with the error's code.
``HYDRA_FULL_ERROR=1`` shows the traceback instead. In a multirun the error is re-raised, so
Hydra records that job as failed and the sweep goes on with the others.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from attnseq.errors import AttnSeqError


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except AttnSeqError as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or in_multirun():
            raise
        print(f"error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(error.exit_code) from None
