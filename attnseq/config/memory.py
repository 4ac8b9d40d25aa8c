"""The model and the lengths fit in memory: a lower bound on what the model's parameters (with their
gradients and optimizer state), the data and one batch of the longest sequences' attention weights
take, against this machine's memory, before minutes of data generation end in a failed allocation.
Reads a ``TrainConfig`` (or a composed DictConfig)."""

from __future__ import annotations

import bisect
import os
from typing import Any, NamedTuple

from attnseq.attention.settings import NO_ATTENTION
from attnseq.data.tasks import TASKS
from attnseq.data.vocab import SPECIAL_TOKENS
from attnseq.errors import ConfigError
from attnseq.problems import override, shown

BYTES_PER_DATA_TOKEN = 48  # a list slot (8 bytes) in source, target, alignment of Example and EncodedExample
BYTES_PER_PARAMETER = 16  # float32 weights, their gradients and Adam's two moments (the default optimizer)


class MemoryNeed(NamedTuple):
    key: str  # the key whose value sets it
    data: int  # the generated examples, in host memory
    batch: int  # one batch of the longest sequences, on the accelerator
    why: str


def model_need(cfg: Any) -> MemoryNeed:
    """A lower bound on the model: both embeddings, the output layer and the decoder's recurrent layers
    (three gates at least, each hidden × (embedding + hidden)), ``BYTES_PER_PARAMETER`` each; on the
    accelerator when training runs there."""
    model, task = cfg.model, TASKS.lookup(cfg.dataset.task)
    src = tgt = len(SPECIAL_TOKENS)  # a corpus's tokens are known once it is read
    if task.generated:
        spec = task.model_validate({name: getattr(cfg.dataset, name) for name in task.model_fields})
        src, tgt = src + len(spec.source_tokens()), tgt + len(spec.target_tokens())
    embedding, hidden, layers = model.embedding_dim, model.hidden_size, model.layers
    parameters = embedding * (src + tgt) + hidden * tgt + 3 * hidden * (embedding + hidden) * layers
    return MemoryNeed("model.hidden_size", 0, BYTES_PER_PARAMETER * parameters,
                      f"a model of at least {parameters:,} parameters, with their gradients and optimizer state: "
                      f"model.embedding_dim={embedding}, model.hidden_size={hidden}, model.layers={layers}, "
                      f"vocabularies of {src} and {tgt} tokens")


LENGTHS = ("dataset.train_lengths", "dataset.eval_lengths")  # the training split's, the evaluation splits'


def length_need(cfg: Any, key: str, hi: int | None = None) -> MemoryNeed:
    """A lower bound, in bytes, for the split whose lengths ``key`` sets (its longest ``hi``): the generated
    examples, and the model with one batch of attention weights (B, heads, T_dec, T_enc) float32 (kept for the
    backward pass in training; for every greedy decoding step in validation). A config it rejects cannot fit."""
    ds, training = cfg.dataset, key == LENGTHS[0]
    lo, top = getattr(ds, key.partition(".")[2])
    hi, count = hi or top, ds.train_size if training else ds.val_size + ds.test_size
    heads = cfg.model.heads if cfg.scorer.name != NO_ATTENTION else 0
    decoded = int(hi * cfg.decode.max_length_ratio) + cfg.decode.max_length_extra
    batch = max(1, ds.batch_size // (hi + 1)) if getattr(ds, "batch_type", "sentence") == "token" else ds.batch_size
    per_token = BYTES_PER_DATA_TOKEN if TASKS.lookup(ds.task).generated else 0
    return MemoryNeed(key, int(count * (lo + hi) / 2 * per_token),
                      model_need(cfg).batch + 4 * batch * heads * (hi + 1 if training else max(decoded, hi + 1)) * hi,
                      f"{count} {'training' if training else 'validation and test'} examples, the model and a batch "
                      f"of {batch} sources of {hi} tokens" + ("" if training else f" decoded up to {decoded} steps"))


class MemoryBudget(NamedTuple):
    """The host's memory, and the accelerator's (None: batches live in host memory too)."""

    host: int
    device: int | None = None

    def fits(self, need: MemoryNeed) -> bool:
        if self.device is None:
            return need.data + need.batch <= self.host
        return need.data <= self.host and need.batch <= self.device

    def __str__(self) -> str:
        device = f" and {_size(self.device)} of accelerator memory" if self.device is not None else ""
        return f"this machine's {_size(self.host)} of memory{device}"


def on_accelerator(cfg: Any) -> bool:
    return str(getattr(cfg.trainer, "accelerator", "cpu")) in ("gpu", "cuda")


def memory_budget(cfg: Any, device: int | None = None) -> MemoryBudget | None:
    """This machine's memory (None where the platform does not say), with the accelerator's ``device``
    memory; None on an accelerator whose memory is not given (stage two reads it once torch is imported)."""
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return None if device is None and on_accelerator(cfg) else MemoryBudget(host, device)


def check_memory(cfg: Any, budget: MemoryBudget | None = None) -> None:
    """Reject a model, or lengths (with this batch size and heads), that cannot fit in ``budget``: the
    model first, so that the message names its sizes; for lengths, the longest that fits."""
    budget = memory_budget(cfg) if budget is None else budget
    if budget is None:
        return
    model = model_need(cfg)
    if not budget.fits(model):
        raise ConfigError(f"{model.key}={cfg.model.hidden_size} needs at least {_size(model.batch)} of memory "
                          f"({model.why}), more than {budget}.",
                          "lower model.hidden_size, model.embedding_dim or model.layers (or dataset.num_symbols).")
    for key in LENGTHS:
        need = length_need(cfg, key)
        if budget.fits(need):
            continue
        lo, hi = getattr(cfg.dataset, key.partition(".")[2])
        first_too_long = bisect.bisect(range(lo, hi + 1), False,
                                       key=lambda n: not budget.fits(length_need(cfg, key, n)))
        sizes = "dataset.train_size" if key == LENGTHS[0] else "dataset.val_size / dataset.test_size"
        sizes += " / model.heads" if cfg.model.heads > 1 and cfg.scorer.name != NO_ATTENTION else ""
        fix = (f"lower the longest length, e.g. {override(key, [lo, lo + first_too_long - 1])} (about the most that "
               f"fits), or lower dataset.batch_size / {sizes}" if first_too_long else
               f"lower dataset.batch_size and {sizes}")
        raise ConfigError(f"{key}={shown([lo, hi])} needs at least {_size(need.data + need.batch)} of memory "
                          f"({need.why}), more than {budget}.", fix + ".")


def _size(count: float) -> str:
    units = ["B", "KB", "MB", "GB", "TB"]
    while count >= 1000 and len(units) > 1:
        count, units = count / 1000, units[1:]
    return f"{count} B" if units[0] == "B" else f"{count:.1f} {units[0]}"
