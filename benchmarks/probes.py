"""Finding a free loopback port and asking whether a local server answers: what the launchers of an
``mlflow server`` in the benchmarks and the tests wait on."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``url`` answers HTTP 200 within ``timeout_s``; False for refused or silent servers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
