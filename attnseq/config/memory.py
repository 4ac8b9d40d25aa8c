"""The lengths fit in memory: a lower bound on what the data and one batch of the longest
sequences' attention weights take, against this machine's memory, before minutes of data
generation end in a failed allocation. Reads a ``TrainConfig`` (or a composed DictConfig)."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from attnseq.attention.settings import NO_ATTENTION
from attnseq.errors import ConfigError
from attnseq.problems import shown

BYTES_PER_DATA_TOKEN = 48
"""A lower bound on the memory one token of synthetic data takes: a list slot (8 bytes) in the
source, target and alignment of both the ``Example`` and the ``EncodedExample``."""
ON_ACCELERATOR = ("gpu", "cuda")


class MemoryNeed(NamedTuple):
    """A lower bound on the memory one side of training takes, and the key whose value sets it."""

    key: str
    data: int  # the generated examples, in host memory
    batch: int  # one batch of the longest sequences, on the accelerator
    why: str


def memory_needs(cfg: Any, train_hi: int | None = None, eval_hi: int | None = None) -> list[MemoryNeed]:
    """Lower bounds, in bytes, on what the training split and the evaluation splits take: the
    generated examples, and one batch of the longest sequences' attention weights,
    (B, heads, T_dec, T_enc) float32 (kept for the backward pass in training; for every greedy
    decoding step in validation). Deliberately low: a config it rejects cannot fit."""
    from attnseq.data.tasks import TASKS

    ds = cfg.dataset
    train_hi = int(ds.train_lengths[1]) if train_hi is None else train_hi
    eval_hi = int(ds.eval_lengths[1]) if eval_hi is None else eval_hi
    batch = int(ds.batch_size)
    heads = int(cfg.model.heads) if cfg.scorer.name != NO_ATTENTION else 0
    decoded = int(eval_hi * float(cfg.decode.max_length_ratio)) + int(cfg.decode.max_length_extra)
    generated = TASKS.lookup(ds.task).generated

    def data(size: int, lo: int, hi: int) -> int:
        return int(size * (lo + hi) / 2 * BYTES_PER_DATA_TOKEN) if generated else 0

    evaluated = int(ds.val_size) + int(ds.test_size)
    return [
        MemoryNeed("dataset.train_lengths", data(int(ds.train_size), int(ds.train_lengths[0]), train_hi),
                   4 * batch * heads * (train_hi + 1) * train_hi,
                   f"{int(ds.train_size)} training examples and a batch of {batch} sources of {train_hi} tokens"),
        MemoryNeed("dataset.eval_lengths", data(evaluated, int(ds.eval_lengths[0]), eval_hi),
                   4 * batch * heads * max(decoded, eval_hi + 1) * eval_hi,
                   f"{evaluated} validation and test examples and a batch of {batch} sources of {eval_hi} "
                   f"tokens decoded up to {decoded} steps"),
    ]


class MemoryBudget(NamedTuple):
    """The memory there is: the host's, and the accelerator's (None: batches live in host memory too)."""

    host: int
    device: int | None = None

    def fits(self, need: MemoryNeed) -> bool:
        if self.device is None:
            return need.data + need.batch <= self.host
        return need.data <= self.host and need.batch <= self.device

    def __str__(self) -> str:
        device = f" and {_size(self.device)} of accelerator memory" if self.device is not None else ""
        return f"this machine's {_size(self.host)} of memory{device}"


def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def on_accelerator(cfg: Any) -> bool:
    trainer = cfg.trainer
    accelerator = (trainer.get("accelerator", "cpu") if hasattr(trainer, "get")
                   else getattr(trainer, "accelerator", "cpu"))
    return str(accelerator) in ON_ACCELERATOR


def memory_budget(cfg: Any) -> MemoryBudget | None:
    """The host's memory; None on an accelerator, whose memory is read once torch is imported
    (``attnseq.training.validation``), or where the platform does not say."""
    host = physical_memory()
    return MemoryBudget(host) if host and not on_accelerator(cfg) else None


def check_memory(cfg: Any, budget: MemoryBudget | None = None) -> None:
    """Reject lengths (with this batch size and heads) that cannot fit in ``budget``."""
    budget = memory_budget(cfg) if budget is None else budget
    if budget is None:
        return
    for index, need in enumerate(memory_needs(cfg)):
        if budget.fits(need):
            continue
        lengths = list(getattr(cfg.dataset, need.key.split(".")[1]))
        longest = _longest_that_fits(cfg, index, budget, lengths[0], lengths[1])
        sizes = "dataset.train_size" if index == 0 else "dataset.val_size / dataset.test_size"
        fix = (f"lower the longest length, e.g. {need.key}=[{lengths[0]}, {longest}] (about the most that "
               f"fits), or lower dataset.batch_size / {sizes}" if longest else f"lower dataset.batch_size and {sizes}")
        raise ConfigError(
            f"{need.key}={shown(lengths)} needs at least {_size(need.data + need.batch)} of memory ({need.why}), "
            f"more than {budget}.",
            fix + ".",
        )


def _longest_that_fits(cfg: Any, index: int, budget: MemoryBudget, lo: int, hi: int) -> int | None:
    def fits(longest: int) -> bool:
        lengths = {"train_hi": longest} if index == 0 else {"eval_hi": longest}
        return budget.fits(memory_needs(cfg, **lengths)[index])

    if not fits(lo):
        return None
    while lo < hi:
        middle = (lo + hi + 1) // 2
        lo, hi = (middle, hi) if fits(middle) else (lo, middle - 1)
    return lo


def _size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{count} B"
        count /= 1000
    return f"{count} B"
