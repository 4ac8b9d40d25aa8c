"""A warm interpreter for the tests' CLI launches: it imports what ``train.py``, ``evaluate.py`` and
``translate.py`` import once, then forks a copy of itself for each launch, which runs the script as
``python <script> <args>`` would (``runpy``, ``__main__``, the interpreter's normal exit).

Why: the imports (torch, Lightning, MLflow) cost 4.5–8 s of CPU per launch on the suite's 2-core
machine, as much as the tiny training they precede, and the suite launches the CLIs a few hundred times
(``benchmarks/results.md``, the suite's launches). What differs from a fresh interpreter, and which tests
still start one (``tests/cli_helpers.py``, ``run_cli``): the imports happened before the launch's
environment was set, so a launch whose environment differs from the server's in a variable read at start
(``STARTUP_VARIABLES``) gets a fresh interpreter instead; the hash seed is the server's; what the imports
printed is printed again first. The signal tests, the startup-cost tests and every launch that is not
``run_cli``'s start fresh interpreters.

Protocol (one Unix-socket connection per launch): the client sends an 8-byte length with the three
descriptors (stdin, stdout, stderr) attached, then that many bytes of JSON (``script``, ``args``,
``cwd``, ``env``); the server answers with two lines, the launch's pid, then its exit code as
``subprocess`` reports one (``-N``: killed by signal N) and its CPU seconds. A supervisor process per launch waits for
it, so the server itself stays single-threaded and never waits. The server ends when its stdin (a pipe
from the test process) closes.

    python tests/zygote.py <socket path>
"""

from __future__ import annotations

import gc
import json
import os
import re
import selectors
import signal
import socket
import struct
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRELOADED = ("attnseq.training.pipeline", "attnseq.evaluation", "attnseq.evaluation.translate")
"""What the entry points import after their checks (``train.py``, ``evaluate.py``, ``translate.py``)."""
STARTUP_VARIABLES = re.compile(
    r"^(PYTHON|OMP_|GOMP_|KMP_|MKL_|OPENBLAS_|LD_|MALLOC_|TORCH|PYTORCH_|CUDA|NVIDIA_|PL_|LIGHTNING_|LANG$|LC_|"
    r"TMPDIR$|TEMP$|TMP$)"
)
"""Environment variables that the interpreter, its C libraries (OpenMP, glibc) or an imported module may
read once, before a launch's own environment is in place: a launch that changes one starts fresh."""
HEADER = struct.Struct("!Q")


def differs_at_startup(server_env: dict[str, str], launch_env: dict[str, str]) -> bool:
    """True when the launch's environment changes a variable read at start (see ``STARTUP_VARIABLES``)."""
    keys = {k for k in server_env.keys() | launch_env.keys() if STARTUP_VARIABLES.match(k)}
    return any(server_env.get(k) != launch_env.get(k) for k in keys)


def _preload() -> bytes:
    """Import what the launches need, as ``train.py`` does (without the cyclic collector, then frozen),
    and return what the imports printed."""
    sys.path[0] = str(REPO)  # as for `python train.py`: the scripts' folder first, not tests/
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as printed:
        os.dup2(printed.fileno(), 1)
        os.dup2(printed.fileno(), 2)
        gc.disable()
        try:
            for module in PRELOADED:
                __import__(module)
        finally:
            gc.freeze()
            gc.enable()
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        printed.seek(0)
        return printed.read()


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
    (size,) = HEADER.unpack(header)
    body = bytearray()
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the client closed the connection mid-request")
        body += chunk
    return json.loads(body), fds


def _serve(listener: socket.socket) -> tuple[dict, list[int]]:
    """Fork a supervisor per request; returns only in a launch's process, with its request."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(0, selectors.EVENT_READ)  # the test process's pipe: closed when it ends
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the supervisors are reaped by the kernel
    while True:
        for key, _ in selector.select():
            if key.fileobj == 0:
                if not os.read(0, 4096):
                    os._exit(0)
                continue
            conn, _ = listener.accept()
            try:
                request, fds = _receive(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:  # the supervisor
                selector.close()
                listener.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                pid = os.fork()
                if pid == 0:  # the launch
                    conn.close()
                    return request, fds
                for fd in fds:
                    os.close(fd)
                try:
                    conn.sendall(f"{pid}\n".encode())
                    _, status, usage = os.wait4(pid, 0)
                    cpu_s = usage.ru_utime + usage.ru_stime
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)} {cpu_s:.3f}\n".encode())
                finally:
                    os._exit(0)
            conn.close()
            for fd in fds:
                os.close(fd)


def _become(request: dict, fds: list[int], printed: bytes) -> None:
    """Turn this forked process into ``python <script> <args>`` started in ``cwd`` with ``env``."""
    for target, fd in enumerate(fds):  # stdin, stdout, stderr: sys.std* keep their objects, now on these
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = str(Path(request["script"]).resolve())
    sys.argv = [request["script"], *request["args"]]
    sys.path[0] = os.path.dirname(script)
    if printed:
        os.write(2, printed)


def main(path: str) -> None:
    printed = _preload()
    if threading.active_count() != 1:  # a fork copies no thread: a launch would miss it
        sys.exit(f"the imports started threads ({threading.enumerate()}): no warm launches")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    request, fds = _serve(listener)
    _become(request, fds, printed)
    del listener, fds, printed
    import runpy

    runpy.run_path(str(Path(request["script"]).resolve()), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1])
