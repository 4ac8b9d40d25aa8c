"""The large buffers a kernel allocates on every call, in blocks the allocator reuses.

glibc's ``malloc`` serves a request above its mmap threshold (at most 32 MiB on 64-bit systems,
where a training process fixes it: ``attnseq.training.process.keep_freed_memory``) with fresh pages
from the system, which the kernel's first write faults in one page at a time — on every call, so on
every training step. A request below it comes from the heap, whose freed memory a training process
keeps: the next step reuses it without a fault. So a buffer that grows with the decoder's steps (σ of
the additive score, ``(T_dec, B, H, T_enc, a)``: 100 MiB for a biGRU's 256-wide keys at 40 steps) is
allocated as blocks of consecutive steps of at most ``BLOCK_BYTES`` each, and a kernel that works
through the steps in chunks holds one block-sized chunk at a time.

On other devices (CUDA's caching allocator reuses freed memory, and each chunk costs kernel launches)
a block is ``DEVICE_BLOCK_BYTES``: every step in one, as before blocks.

The size is measured, not derived: ``benchmarks/kernel_blocks.py`` times the all-steps additive score
(forward and backward, where the block is also the working set the caches see) and the recurrences'
kept σ over block sizes (``benchmarks/results.md``, "Kernel buffers in blocks").
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK_BYTES = 6 * 2**20
"""The most bytes of one block of steps on the CPU (one step more where a single step is larger): below
glibc's mmap threshold, and small enough for a chunk of the all-steps score to stay in the caches."""
DEVICE_BLOCK_BYTES = 256 * 2**20
"""The most bytes of one block elsewhere (CUDA): a bound on the memory of a chunk, not a cache size."""


def steps_per_block(step_bytes: int, device: torch.device) -> int:
    """How many consecutive steps of ``step_bytes`` bytes each one block on ``device`` holds (at least one)."""
    block = BLOCK_BYTES if device.type == "cpu" else DEVICE_BLOCK_BYTES
    return max(1, block // max(1, step_bytes))


def step_blocks(steps: int, like: Tensor) -> tuple[Tensor, ...]:
    """Uninitialised buffers for ``steps`` tensors shaped like ``like``, as blocks ``(k, *like.shape)`` of
    ``steps_per_block`` steps each (the last one shorter); read one step with ``block_step``."""
    per_block = steps_per_block(like.numel() * like.element_size(), like.device)
    return tuple(like.new_empty(min(per_block, steps - start), *like.shape) for start in range(0, steps, per_block))


def block_step(blocks: tuple[Tensor, ...] | list[Tensor], t: int) -> Tensor:
    """Step ``t`` of ``step_blocks``' blocks: a view ``like.shape`` into its block."""
    per_block = blocks[0].shape[0]
    return blocks[t // per_block][t % per_block]
