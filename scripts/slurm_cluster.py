#!/usr/bin/env python3
"""A single-node Slurm cluster in one folder: munged, slurmctld and slurmd of Debian's ``slurm-wlm``
and ``munge`` packages (``scripts/install-system-deps``), for the tests (``tests/test_slurm.py``) and
for trying a sweep on a laptop (``make slurm-up`` / ``make slurm-down``).

    python scripts/slurm_cluster.py up [FOLDER]     # start it; prints what to export
    python scripts/slurm_cluster.py env [FOLDER]    # the same lines again
    python scripts/slurm_cluster.py down [FOLDER]   # cancel its jobs, stop its daemons, check nothing is left

Everything lives under FOLDER (default ``.slurm/``): ``slurm.conf``, the munge key (its socket in a
folder of its own under the temporary folder, removed by ``down``), the controller's state, slurmd's
spool, pid and log files, and ``bin/sacct``. Nothing in ``/etc`` changes and nothing is left running
after ``down``. Made for a container (no systemd, no cgroups): process tracking
by ``/proc`` (``proctrack/linuxproc``), no task binding (``task/none``), no accounting database; the node
declares the machine's real topology (``slurmd -C``), its cores consumable one by one (``cons_tres`` +
``CR_Core``).

Clients need ``SLURM_CONF`` (sbatch, squeue, scancel, submitit, and the jobs, which inherit it) and
``bin/`` first on ``PATH``: without an accounting database there is no ``sacct``, which submitit polls for
job states; ``bin/sacct`` answers its one question (``-o JobID,State,NodeList --parsable2 -j …``) from
``squeue --states=all``, which shows finished jobs for ``MinJobAge`` seconds.

Standard library only: the Makefile runs it with any Python 3.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")  # started in this order, stopped in the reverse
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
KILL_WAIT_S = 30
"""Slurm's ``KillWait``: between a job's SIGTERM (``scancel``, a requeue) and its SIGKILL: the time a
training has to save its checkpoint and mark its MLflow run."""
CRED_EXPIRE_S = 10
"""munge credentials' lifetime for Slurm; a requeued job waits that long before it runs again (the
default, 120 s, would make every requeue wait two minutes)."""
MIN_JOB_AGE_S = 300
"""How long a finished job stays in the controller's memory (what ``squeue --states=all``, and so
``bin/sacct``, can still report)."""
INSTALL_HINT = "`make system-deps` installs them (scripts/install-system-deps), or: apt-get install slurm-wlm munge"

SACCT = """#!/bin/sh
# sacct without an accounting database, for submitit: the states of the jobs named by -j, from squeue
# (jobs finished in the last MinJobAge seconds included), as `sacct -o JobID,State,NodeList --parsable2`.
ids=""
while [ $# -gt 0 ]; do
  case "$1" in
    -j|--jobs) ids="$ids $(echo "$2" | tr ',' ' ')"; shift 2 ;;
    -j*) ids="$ids $(echo "${1#-j}" | tr ',' ' ')"; shift ;;
    *) shift ;;
  esac
done
echo "JobID|State|NodeList"
squeue --states=all --noheader --format='%i|%T|%N' | awk -F'|' -v ids="$ids" '
  BEGIN { n = split(ids, wanted, " "); for (i = 1; i <= n; i++) { split(wanted[i], base, "_"); want[base[1]] = 1 } }
  { split($1, id, "_"); if (id[1] in want) print }'
"""


def missing_binaries() -> list[str]:
    names = ("munged", "mungekey", "slurmctld", "slurmd", "squeue", "sinfo", "scancel", "sbatch", "srun")
    return [name for name in names if _which(name) is None]


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def node_topology() -> str:
    """This machine as slurmd sees it (``slurmd -C``): ``CPUs=2 Boards=1 … RealMemory=24105``."""
    first = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True, check=True,
                           timeout=30).stdout.splitlines()[0]
    return " ".join(word for word in first.split() if not word.startswith(("NodeName=", "UpTime=")))


class SlurmCluster:
    """One controller and one node (this machine) configured and kept under ``folder``; a context
    manager (started on entry, stopped on exit)."""

    def __init__(self, folder: Path, partition: str = "debug") -> None:
        self.folder = Path(folder).resolve()
        self.partition = partition
        self.conf = self.folder / "slurm.conf"
        self.bin = self.folder / "bin"
        self.munge = self.folder / "munge"  # the key and munged's seed
        self.logs = self.folder / "log"
        self.run_dir = self.folder / "run"
        self.procs: dict[str, subprocess.Popen] = {}

    # -- what clients need ------------------------------------------------------------------------
    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        base = dict(os.environ if base is None else base)
        return base | {"SLURM_CONF": str(self.conf), "PATH": f"{self.bin}{os.pathsep}{base.get('PATH', '')}"}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, check=check,
                              timeout=timeout)

    def pid_file(self, daemon: str) -> Path:
        return self.run_dir / f"{daemon}.pid"

    @property
    def munge_socket(self) -> Path:
        """munged's socket: in a folder of its own under the system's temporary folder, since munged
        refuses a socket that not everyone can reach (every folder above it searchable by all: pytest's
        temporary folders are not) in a folder other than mode 0755; made once, its path kept in the
        folder."""
        kept = self.run_dir / "munge-socket-folder"
        if not kept.exists():
            self.run_dir.mkdir(parents=True, exist_ok=True)
            made = Path(tempfile.mkdtemp(prefix="attnseq-munge-"))
            made.chmod(0o755)
            kept.write_text(f"{made}\n")
        return Path(kept.read_text().strip()) / "munge.socket"

    # -- configuration ----------------------------------------------------------------------------
    def write_config(self) -> None:
        for folder in (self.folder, self.bin, self.logs, self.run_dir, self.folder / "state", self.folder / "spool"):
            folder.mkdir(parents=True, exist_ok=True)
        self.munge.mkdir(mode=0o700, exist_ok=True)
        key = self.munge / "munge.key"
        if not key.exists():
            subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True,
                           timeout=30)
        key.chmod(0o600)
        sacct = self.bin / "sacct"
        sacct.write_text(SACCT)
        sacct.chmod(0o755)
        host = socket.gethostname().split(".")[0]  # `hostname -s`: what slurmd takes itself for
        user = getpass.getuser()
        self.conf.write_text("\n".join([
            "# written by scripts/slurm_cluster.py: one controller and one node, this machine, in this folder",
            "ClusterName=attnseq",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE_S}",
            f"StateSaveLocation={self.folder / 'state'}",
            f"SlurmdSpoolDir={self.folder / 'spool'}",
            f"SlurmctldPidFile={self.pid_file('slurmctld')}",
            f"SlurmdPidFile={self.pid_file('slurmd')}",
            f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
            f"SlurmdLogFile={self.logs / 'slurmd.log'}",
            # a container: no systemd, no cgroups, no accounting database
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "MailProg=/bin/true",
            "JobRequeue=1",
            "ReturnToService=2",
            f"KillWait={KILL_WAIT_S}",
            f"MinJobAge={MIN_JOB_AGE_S}",
            "SchedulerParameters=sched_interval=1",
            f"NodeName={host} NodeAddr=127.0.0.1 {node_topology()} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    # -- starting and stopping --------------------------------------------------------------------
    def start(self) -> SlurmCluster:
        missing = missing_binaries()
        if missing:
            raise RuntimeError(f"not installed: {', '.join(missing)}. {INSTALL_HINT}")
        self.write_config()
        conf = str(self.conf)
        argv = {
            "munged": [_which("munged"), "--foreground", f"--key-file={self.munge / 'munge.key'}",
                       f"--socket={self.munge_socket}", f"--pid-file={self.pid_file('munged')}",
                       f"--log-file={self.logs / 'munged.log'}", f"--seed-file={self.munge / 'munge.seed'}"],
            "slurmctld": [_which("slurmctld"), "-D", "-i", "-f", conf],
            "slurmd": [_which("slurmd"), "-D", "-f", conf],
        }
        try:
            for daemon in DAEMONS:
                with (self.logs / f"{daemon}.out").open("a") as out:
                    # a session of its own: a Ctrl-C in the terminal that started it does not reach it
                    self.procs[daemon] = subprocess.Popen(argv[daemon], stdout=out, stderr=subprocess.STDOUT,
                                                          stdin=subprocess.DEVNULL, env=self.env(),
                                                          start_new_session=True)
                if daemon == "munged":
                    self._wait(lambda: self.munge_socket.exists(), "munged's socket", daemon)
                if daemon == "slurmctld":
                    self._wait(lambda: self.run("scontrol", "ping", check=False).returncode == 0,
                               "slurmctld answering", daemon)
            self._wait(lambda: self.node_state() == "idle", "the node idle", "slurmd")
        except BaseException:
            self.stop()
            raise
        for daemon, proc in self.procs.items():
            self.pid_file(daemon).write_text(f"{proc.pid}\n")  # the daemon's own pid (it runs in the foreground)
        return self

    def _wait(self, ready, what: str, daemon: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            proc = self.procs.get(daemon)
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                log = self.logs / f"{daemon}.log"
                log = log if log.exists() else self.logs / f"{daemon}.out"
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
                state = "exited" if proc is not None and proc.poll() is not None else "still waiting"
                raise RuntimeError(f"no {what} after {START_TIMEOUT_S} s ({daemon} {state}); {log}:\n{tail}")
            time.sleep(0.2)

    def node_state(self) -> str:
        proc = self.run("sinfo", "--noheader", "--Node", "--format=%T", check=False)
        return proc.stdout.strip().rstrip("*~#") if proc.returncode == 0 else ""

    def jobs(self) -> list[str]:
        """The ids of the jobs not yet ended (pending, running, completing)."""
        proc = self.run("squeue", "--noheader", "--format=%A", check=False)
        return proc.stdout.split() if proc.returncode == 0 else []

    def stop(self) -> None:
        """Cancel every job (waiting for them to end), then stop the daemons, slurmd first; then make
        sure none of the cluster's processes, nor any job's, is left."""
        if self._running("slurmctld"):
            jobs = self.jobs()
            if jobs:
                self.run("scancel", *jobs, check=False)
                deadline = time.monotonic() + KILL_WAIT_S + STOP_TIMEOUT_S
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.5)
        for daemon in reversed(DAEMONS):
            self._stop_daemon(daemon)
        for pid in self.leftovers():  # a job's process that outlived its slurmstepd
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        kept = self.run_dir / "munge-socket-folder"
        if kept.exists():
            shutil.rmtree(kept.read_text().strip(), ignore_errors=True)
            kept.unlink()

    def _pid(self, daemon: str) -> int | None:
        if daemon in self.procs:
            return self.procs[daemon].pid
        try:
            return int(self.pid_file(daemon).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _running(self, daemon: str) -> bool:
        pid = self._pid(daemon)
        return pid is not None and alive(pid) and self._ours(pid)

    def _ours(self, pid: int) -> bool:
        """The process is this cluster's daemon: its command line names this folder (a stale pid file
        must not make ``down`` signal an unrelated process that got the same pid)."""
        try:
            return str(self.folder) in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return False

    def _stop_daemon(self, daemon: str) -> None:
        pid = self._pid(daemon)
        if pid is None or not alive(pid) or not self._ours(pid):
            self.pid_file(daemon).unlink(missing_ok=True)
            return
        os.kill(pid, signal.SIGTERM)
        proc = self.procs.get(daemon)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while alive(pid) and time.monotonic() < deadline:
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.2)
            else:
                time.sleep(0.2)
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc is not None:
            proc.wait(timeout=STOP_TIMEOUT_S)
        self.pid_file(daemon).unlink(missing_ok=True)

    def leftovers(self) -> list[int]:
        """Live processes of this cluster: its daemons (munged, slurmctld, slurmd naming this folder), their
        helpers (slurmstepd, slurmscriptd) and its jobs' processes (``SLURM_JOB_ID`` set), found by this
        cluster's ``SLURM_CONF`` in their environment. Not the processes that only use the cluster (a
        shell that exported ``SLURM_CONF``, a sweep waiting for its jobs), nor this process or its parents."""
        marker = f"SLURM_CONF={self.conf}".encode()
        spared = {os.getpid(), *ancestors()}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in spared or not alive(int(entry.name)):
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            daemon = os.path.basename(argv[0]).decode(errors="replace") in DAEMONS and any(
                str(self.folder).encode() in arg for arg in argv)
            helper = argv[0].startswith((b"slurmstepd", b"slurmctld:"))
            job = any(variable.startswith(b"SLURM_JOB_ID=") for variable in environ)
            if daemon or (marker in environ and (helper or job)):
                found.append(int(entry.name))
        return found

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def alive(pid: int) -> bool:
    """Running: not gone and not a zombie (a daemon whose parent has not reaped it yet is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def ancestors() -> list[int]:
    """This process's parent, its parent's parent, … up to PID 1."""
    found, pid = [], os.getpid()
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        found.append(pid)
    return found


def exports(cluster: SlurmCluster) -> str:
    return f"export SLURM_CONF={cluster.conf}\nexport PATH={cluster.bin}:$PATH"


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("up", "down", "env") or len(argv) > 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    cluster = SlurmCluster(Path(argv[1] if len(argv) > 1 else ".slurm"))
    if argv[0] == "up":
        if cluster._running("slurmctld"):
            print(f"already running in {cluster.folder}", file=sys.stderr)
        else:
            try:
                cluster.start()
            except RuntimeError as error:
                print(f"slurm-up: {error}", file=sys.stderr)
                return 1
            print(f"Slurm is up in {cluster.folder}: partition '{cluster.partition}', node {node_topology()}",
                  file=sys.stderr)
        print(exports(cluster))
        return 0
    if argv[0] == "env":
        print(exports(cluster))
        return 0
    cluster.stop()
    left = cluster.leftovers()
    if left:
        print(f"slurm-down: still running: pids {' '.join(map(str, left))}", file=sys.stderr)
        return 1
    print(f"Slurm in {cluster.folder} is stopped; nothing of it is left running", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
