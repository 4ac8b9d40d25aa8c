"""What the benchmark times: the textbook baseline, the minimal loop, the real path (Lightning)
with other loops in lock step, activation memory and decoding."""

from __future__ import annotations

import contextlib
import os
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnseq.config import validate_train
from attnseq.data.batch import Batch
from attnseq.data.vocab import BOS, EOS, PAD
from attnseq.model import beam_search, greedy_decode
from attnseq.tracking.logged_model import logging_scope
from attnseq.training.build import optimizer_factory
from attnseq.training.lit_module import Seq2SeqLitModule, decode_length_limit

BASELINE = "textbook"


class TextbookBahdanau(nn.Module):
    """Bahdanau attention as textbooks write it: one ``nn.GRU`` call of length 1 per token,
    ``torch.cat`` per step, and U_a h_i recomputed at every step — or, with
    ``project_keys_once``, computed once per batch (the time-to-accuracy baseline). attnseq's
    gru/additive/bahdanau maths either way."""

    def __init__(self, src_vocab: int, tgt_vocab: int, emb: int, hidden: int, project_keys_once: bool = False) -> None:
        super().__init__()
        self.project_keys_once = project_keys_once
        self.src_embedding = nn.Embedding(src_vocab, emb, padding_idx=PAD)
        self.tgt_embedding = nn.Embedding(tgt_vocab, emb, padding_idx=PAD)
        self.encoder = nn.GRU(emb, hidden, batch_first=True)
        self.W_a = nn.Linear(hidden, hidden, bias=False)
        self.U_a = nn.Linear(hidden, hidden, bias=False)
        self.v_a = nn.Linear(hidden, 1, bias=False)
        self.decoder = nn.GRU(emb + hidden, hidden, batch_first=True)
        self.readout = nn.Linear(hidden + hidden + emb, tgt_vocab)

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        """The keys, their projection U_a h_i (``None`` unless projected once), the source mask
        and the decoder's first state."""
        embedded_src = self.src_embedding(src)  # (B, T_enc, E)
        packed = pack_padded_sequence(embedded_src, src_lengths.cpu(), batch_first=True, enforce_sorted=False)
        packed_keys, state = self.encoder(packed)  # state (1, B, d)
        keys, _ = pad_packed_sequence(packed_keys, batch_first=True, total_length=src.shape[1])  # (B, T_enc, d)
        projected = self.U_a(keys) if self.project_keys_once else None  # (B, T_enc, d)
        valid = torch.arange(src.shape[1], device=src.device)[None, :] < src_lengths[:, None]  # (B, T_enc)
        return keys, projected, valid, state

    def step(
        self, token: Tensor, state: Tensor, keys: Tensor, projected: Tensor | None, valid: Tensor
    ) -> tuple[Tensor, Tensor]:
        """One decoder step from the previous token (B,) and state s_{t-1} (1, B, d): logits and s_t."""
        embedded = self.tgt_embedding(token)  # (B, E)
        query = state[-1]  # (B, d): s_{t-1}
        keys_term = projected if projected is not None else self.U_a(keys)  # (B, T_enc, d)
        energy = self.v_a(torch.tanh(self.W_a(query).unsqueeze(1) + keys_term)).squeeze(-1)  # (B, T_enc)
        weights = torch.softmax(energy.masked_fill(~valid, float("-inf")), dim=-1)  # (B, T_enc)
        context = torch.bmm(weights.unsqueeze(1), keys).squeeze(1)  # (B, d)
        output, state = self.decoder(torch.cat([embedded, context], dim=-1).unsqueeze(1), state)  # (B, 1, d)
        return self.readout(torch.cat([output.squeeze(1), context, embedded], dim=-1)), state  # (B, V)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> tuple[Tensor, None]:
        keys, projected, valid, state = self.encode(src, src_lengths)
        logits = []
        for t in range(tgt_in.shape[1]):
            step_logits, state = self.step(tgt_in[:, t], state, keys, projected, valid)  # (B, V)
            logits.append(step_logits)
        return torch.stack(logits, dim=1), None  # (B, T_dec, V)

    @torch.no_grad()
    def greedy(self, src: Tensor, src_lengths: Tensor, max_length: int) -> Tensor:
        """Greedy decoding: (B, T_out) tokens, PAD after each sequence's EOS."""
        keys, projected, valid, state = self.encode(src, src_lengths)
        token = torch.full((src.shape[0],), BOS, dtype=torch.long, device=src.device)  # (B,)
        finished = torch.zeros_like(token, dtype=torch.bool)  # (B,)
        tokens = []
        for _ in range(max_length):
            step_logits, state = self.step(token, state, keys, projected, valid)  # (B, V)
            token = step_logits.argmax(-1).masked_fill(finished, PAD)  # (B,)
            tokens.append(token)
            finished = finished | (token == EOS)
            if bool(finished.all()):
                break
        return torch.stack(tokens, dim=1)  # (B, T_out)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def loss_fn(logits: Tensor, target: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD)  # as Seq2SeqLitModule.loss


class Loop:
    """A minimal training loop over one model, stepped from outside: ``step()`` fetches its next
    batch from its own DataLoader and trains on it; ``durations`` holds each step's seconds;
    ``bf16``: under bf16 autocast (by default on CUDA only)."""

    def __init__(self, model: nn.Module, loader, cfg, device: str, bf16: bool | None = None) -> None:
        self.bf16 = device == "cuda" if bf16 is None else bf16
        self.model = model.to(device).train()
        self.optimizer = optimizer_factory(validate_train(cfg).optimizer)(model.parameters())  # as train() makes it
        self.clip = cfg.trainer.gradient_clip_val
        self.batches = iter(loader)
        self.device = device
        self.durations: list[float] = []
        self.last_shape: tuple[int, ...] = ()
        self.tokens: list[int] = []  # each step's target tokens (EOS included): what two loops share
        self.losses: list[Tensor] = []  # each step's loss, detached

    def step(self) -> None:
        sync(self.device)
        began = time.perf_counter()
        fetched = next(self.batches)
        batch = fetched.to(self.device)
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.bf16):
            logits, _ = self.model(batch.src, batch.src_lengths, batch.tgt_in)
            loss = loss_fn(logits, batch.tgt_out)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        sync(self.device)
        self.durations.append(time.perf_counter() - began)
        self.last_shape = tuple(batch.tgt_in.shape)
        self.tokens.append(int(fetched.tgt_lengths.sum()))
        self.losses.append(loss.detach())


def step_together(loops: list[Loop], steps: int) -> None:
    """``steps`` rounds of one step of every loop, without a trainer."""
    for _ in range(steps):
        for loop in loops:
            loop.step()


class LockStep(Callback):
    """At each training batch start, one step of every loop in ``loops`` (same batch order), timed
    apart: the trainer's own step ``i`` lasts from the end of these (batch ``i``) to the next batch start."""

    def __init__(self, loops: dict[str, Loop], device: str) -> None:
        self.loops = loops
        self.device = device
        self.before: list[float] = []
        self.after: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        sync(self.device)
        self.before.append(time.perf_counter())
        for loop in self.loops.values():
            loop.step()
            if loop.last_shape != tuple(batch.tgt_in.shape):
                raise RuntimeError(f"lock step lost: {loop.last_shape} vs {tuple(batch.tgt_in.shape)}")
        self.after.append(time.perf_counter())

    def durations(self) -> list[float]:
        return [self.before[i + 1] - self.after[i] for i in range(len(self.before) - 1)]


def window_rates(durations: list[float], tokens: list[int], warmup: int, window: int, windows: int) -> list[float]:
    """Tokens per second over each window of ``window`` steps after ``warmup`` steps."""
    rates = []
    for j in range(windows):
        a = warmup + j * window
        b = a + window
        if b <= len(durations):
            rates.append(sum(tokens[a:b]) / sum(durations[a:b]))
    return rates


def real_path(
    module: Seq2SeqLitModule, cfg, datamodule, loops: dict[str, Loop], steps: int, device: str
) -> list[float]:
    """``steps`` steps of ``lightning.Trainer`` (the config's arguments, MLflow logging) on
    ``module``, with ``loops`` in lock step; returns the trainer's step durations."""
    logger = MLFlowLogger(experiment_name=cfg.mlflow.experiment_name, tracking_uri=cfg.mlflow.tracking_uri)
    clock = LockStep(loops, device)
    trainer_args = OmegaConf.to_container(cfg.trainer, resolve=True)
    if device == "cuda":
        trainer_args.update(accelerator="gpu", devices=1, precision="bf16-mixed")
    trainer_args.update(
        max_steps=steps,
        limit_val_batches=0,  # validation is not training throughput
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer = L.Trainer(**trainer_args, logger=logger, callbacks=[clock], default_root_dir=cfg.paths.output_dir)
    # Lightning's MLFlowLogger sets MLflow's process-wide tracking URI (and MLFLOW_TRACKING_URI): put back
    # afterwards, or every later MLflow call of a process that benchmarks in-process (the tests) goes here
    with (logging_scope(MlflowClient(cfg.mlflow.tracking_uri)), open(os.devnull, "w") as sink,
          contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink)):
        trainer.fit(module, datamodule=datamodule)  # the progress bar renders, into nothing
    return clock.durations()


def activation_bytes(model: nn.Module, batch: Batch, device: str) -> int:
    """Bytes saved for backward by one forward pass (distinct storages); on CUDA the allocator's
    peak over a whole step."""
    model.to(device).train()
    batch = batch.to(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
        loss_fn(logits, batch.tgt_out).backward()
        model.zero_grad(set_to_none=True)
        return torch.cuda.max_memory_allocated()
    storages: dict[int, int] = {}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
        loss = loss_fn(logits, batch.tgt_out)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values())


# ---- decoding: each function decodes one batch and returns the tokens it emitted


def greedy_batched(model: nn.Module, batch: Batch, ratio: float, extra: int) -> int:
    limit = decode_length_limit(batch.src_lengths, ratio, extra)
    return int(greedy_decode(model, batch.src, batch.src_lengths, max_length=limit).lengths.sum())


def greedy_one_at_a_time(model: nn.Module, batch: Batch, ratio: float, extra: int) -> int:
    emitted = 0
    for b in range(len(batch)):
        n = int(batch.src_lengths[b])
        src, lengths = batch.src[b : b + 1, :n], batch.src_lengths[b : b + 1]  # (1, n), (1,)
        limit = decode_length_limit(lengths, ratio, extra)
        emitted += int(greedy_decode(model, src, lengths, max_length=limit).lengths.sum())
    return emitted


def beam_batched(model: nn.Module, batch: Batch, ratio: float, extra: int) -> int:
    limit = decode_length_limit(batch.src_lengths, ratio, extra)
    return int(beam_search(model, batch.src, batch.src_lengths, beam_size=4, max_length=limit).lengths.sum())


DECODINGS = {
    "greedy, batches of 64": greedy_batched,
    "greedy, one sequence at a time": greedy_one_at_a_time,
    "beam search K=4, batches of 64": beam_batched,
}


@torch.no_grad()
def decoding(model: nn.Module, examples, datamodule, cfg, device: str, log) -> dict:
    """Each of ``DECODINGS`` over the same sources, in batches of 64 from the validation-style
    sorted loader, with the length limits of evaluation: sequences and tokens per second."""
    model.to(device).eval()
    batches = [b.to(device) for b in datamodule.make_dataloader(examples, 64)]
    limits = (cfg.decode.max_length_ratio, cfg.decode.max_length_extra)
    greedy_batched(model, batches[0], *limits)  # warm-up
    result = {}
    for name, decode in DECODINGS.items():
        sync(device)
        began = time.perf_counter()
        emitted = sum(decode(model, batch, *limits) for batch in batches)
        sync(device)
        seconds = time.perf_counter() - began
        result[name] = {"seq_s": len(examples) / seconds, "tok_s": emitted / seconds}
        log(f"decoding  {name:32s} {len(examples) / seconds:8.1f} sequences/s")
    return result
