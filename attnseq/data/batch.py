"""A padded batch of encoded examples, and ``collate`` that packs one.

Shapes: B = batch size, T_src = longest source, T_tgt = longest target + 1 (for BOS/EOS).
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from attnseq.data.example import EncodedExample
from attnseq.data.vocab import BOS, EOS, PAD

NO_ALIGNMENT = -1


@dataclass(repr=False)
class Batch:
    """Tensors of one batch; Lightning moves this dataclass to the device field by field.

    Attributes:
        src: (B, T_src) long, source ids padded with PAD.
        src_lengths: (B,) long, real source tokens per row (>= 1).
        tgt_in: (B, T_tgt) long, decoder input ``[BOS, y1..yn]`` then PAD.
        tgt_out: (B, T_tgt) long, decoder target ``[y1..yn, EOS]`` then PAD.
        tgt_lengths: (B,) long, n + 1 (the EOS counts).
        alignment: (B, T_tgt) long, gold source position of each ``tgt_out`` token; -1 at EOS,
            padding and unaligned tokens, and everywhere when the data has no gold alignment.
            Test ``(batch.alignment >= 0).any()`` to know whether there is any.
    """

    src: torch.Tensor
    src_lengths: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_lengths: torch.Tensor
    alignment: torch.Tensor

    def __post_init__(self) -> None:
        B = self.src.shape[0]
        expected = {
            "src": (B, self.src.shape[1]),
            "src_lengths": (B,),
            "tgt_in": (B, self.tgt_in.shape[-1]),
            "tgt_out": (B, self.tgt_in.shape[-1]),
            "tgt_lengths": (B,),
            "alignment": (B, self.tgt_in.shape[-1]),
        }
        for name, shape in expected.items():
            tensor = getattr(self, name)
            if tuple(tensor.shape) != shape or tensor.dtype != torch.long:
                raise ValueError(
                    f"Batch.{name} must be a long tensor of shape {shape}, got {tensor.dtype} {tuple(tensor.shape)}"
                )

    def __len__(self) -> int:
        return self.src.shape[0]

    def __repr__(self) -> str:
        shapes = ", ".join(f"{f.name}={tuple(getattr(self, f.name).shape)}" for f in fields(self))
        return f"Batch({shapes}, device={self.src.device})"

    def to(self, device: torch.device | str) -> Batch:
        """A copy with every tensor on ``device``."""
        return Batch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @property
    def src_valid_mask(self) -> torch.Tensor:
        """(B, T_src) bool, True where the source token is real (not padding)."""
        positions = torch.arange(self.src.shape[1], device=self.src.device)  # (T_src,)
        return positions[None, :] < self.src_lengths[:, None]  # (B, T_src)

    @property
    def tgt_valid_mask(self) -> torch.Tensor:
        """(B, T_tgt) bool, True where ``tgt_out`` holds a real token or the EOS."""
        positions = torch.arange(self.tgt_out.shape[1], device=self.tgt_out.device)  # (T_tgt,)
        return positions[None, :] < self.tgt_lengths[:, None]  # (B, T_tgt)


def _long_tensor(values: list[int]) -> torch.Tensor:
    """A 1-D long tensor over a flat run of ints, through a C array (cheaper than ``torch.tensor``
    on a long Python list)."""
    return torch.frombuffer(array.array("q", values), dtype=torch.long) if values else torch.empty(0, dtype=torch.long)


def collate(examples: Sequence[EncodedExample]) -> Batch:
    """Pack encoded examples into a padded ``Batch`` (adds BOS to ``tgt_in``, EOS to ``tgt_out``).

    One flat tensor per field, scattered through a length mask, rather than a few small
    tensors per example: collation is a visible share of a small model's training step on CPU
    (the comparison is in benchmarks/results.md's history)."""
    if len(examples) == 0:
        raise ValueError("collate needs at least one example")
    chain = itertools.chain.from_iterable
    src_lengths = torch.tensor([len(ex.src) for ex in examples], dtype=torch.long)  # (B,)
    tgt_lengths = torch.tensor([len(ex.tgt) + 1 for ex in examples], dtype=torch.long)  # (B,): the EOS counts
    B, T_src, T_tgt = len(examples), int(src_lengths.max()), int(tgt_lengths.max())
    src_real = torch.arange(T_src)[None, :] < src_lengths[:, None]  # (B, T_src)
    tgt_real = torch.arange(T_tgt)[None, :] < tgt_lengths[:, None]  # (B, T_tgt)
    src = torch.full((B, T_src), PAD, dtype=torch.long)  # (B, T_src)
    src[src_real] = _long_tensor(list(chain(ex.src for ex in examples)))
    tgt_in = torch.full((B, T_tgt), PAD, dtype=torch.long)  # (B, T_tgt): BOS y1..yn, then PAD
    tgt_in[tgt_real] = _long_tensor(list(chain((BOS, *ex.tgt) for ex in examples)))
    tgt_out = torch.full((B, T_tgt), PAD, dtype=torch.long)  # (B, T_tgt): y1..yn EOS, then PAD
    tgt_out[tgt_real] = _long_tensor(list(chain((*ex.tgt, EOS) for ex in examples)))
    alignment = torch.full((B, T_tgt), NO_ALIGNMENT, dtype=torch.long)  # (B, T_tgt)
    if any(ex.alignment is not None for ex in examples):
        gold = [(*(ex.alignment if ex.alignment is not None else [NO_ALIGNMENT] * len(ex.tgt)), NO_ALIGNMENT)
                for ex in examples]  # the EOS has no source position
        alignment[tgt_real] = _long_tensor(list(chain(gold)))
    return Batch(src, src_lengths, tgt_in, tgt_out, tgt_lengths, alignment)
