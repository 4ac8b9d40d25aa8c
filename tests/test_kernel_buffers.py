"""``kernels.buffers``: the blocks of steps a kernel allocates below the allocator's mmap threshold."""

from __future__ import annotations

import pytest
import torch
from recurrence_checks import store_sigmas

from attnseq.kernels import buffers
from attnseq.kernels.additive_attention_steps import AdditiveAttentionSteps
from attnseq.kernels.buffers import block_step, step_blocks, steps_per_block


@pytest.mark.parametrize("steps", [1, 7, 40])
@pytest.mark.parametrize("shape", [(64, 1, 40, 256), (3, 2, 5, 4), (4096, 1, 40, 256)])
def test_blocks_hold_every_step_once_each_within_the_block_size_unless_one_step_is_larger(steps, shape):
    like = torch.empty(shape)
    step_bytes = like.numel() * like.element_size()
    blocks = step_blocks(steps, like)
    assert sum(block.shape[0] for block in blocks) == steps
    assert all(block.shape[1:] == like.shape for block in blocks)
    for block in blocks:
        assert block.numel() * block.element_size() <= max(buffers.BLOCK_BYTES, step_bytes)
    assert all(block.shape[0] == blocks[0].shape[0] for block in blocks[:-1])  # only the last one shorter
    for t in range(steps):  # each step its own memory: write its index, read every step back
        block_step(blocks, t).fill_(t)
    assert [int(block_step(blocks, t).flatten()[0]) for t in range(steps)] == list(range(steps))
    assert [float(block_step(blocks, t).mean()) for t in range(steps)] == [float(t) for t in range(steps)]


def test_the_block_size_stays_under_glibcs_mmap_ceiling_and_a_block_holds_at_least_one_step():
    assert buffers.BLOCK_BYTES < 32 * 2**20  # glibc's largest M_MMAP_THRESHOLD on 64-bit systems
    cpu = torch.device("cpu")
    assert steps_per_block(10 * buffers.BLOCK_BYTES, cpu) == 1
    assert steps_per_block(buffers.BLOCK_BYTES // 4, cpu) == 4


def test_on_cuda_a_block_holds_every_step_of_the_benchmarks_sizes():
    """CUDA's caching allocator reuses freed memory and each chunk costs launches: one block of all 41 steps
    of σ at a biGRU's width (batch 64, 40 sources, 256 wide), as before blocks."""
    step_bytes = 64 * 40 * 256 * 4
    assert steps_per_block(step_bytes, torch.device("cuda")) >= 41 > steps_per_block(step_bytes, torch.device("cpu"))


def test_the_tests_blocks_of_three_steps_split_a_recurrences_sigmas(monkeypatch):
    """What ``SIGMA_STORES``' "kept in blocks" makes of a 4-step recurrence: blocks of 3 and 1 steps."""
    store_sigmas(monkeypatch, "kept in blocks")
    keys = torch.randn(2, 1, 5, 3)
    steps = AdditiveAttentionSteps(keys, keys, torch.ones(2, 5, dtype=torch.bool), torch.randn(1, 3), steps=4)
    assert [block.shape[0] for block in steps.sigmas] == [3, 1]
