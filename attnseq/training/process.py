"""Settings of the training process itself (not of the model): how the C allocator treats freed memory.

glibc's ``malloc`` serves large blocks (above a threshold it moves between 128 KiB and 32 MiB)
with fresh ``mmap`` pages and trims the heap's free top back to the system, so a training step
that allocates and frees the same few-MiB buffers every step faults every page of them in again,
every step. ``keep_freed_memory`` fixes the threshold at glibc's maximum and stops the trimming:
freed memory stays with the process and is reused. The process's resident size stays at its peak
(the peak is what it needed anyway). Other C libraries are left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit systems
TRIM_THRESHOLD = 2**30


def keep_freed_memory() -> bool:
    """Keep freed heap memory for reuse (glibc only); True if the allocator took the settings."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
