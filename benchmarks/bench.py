"""Training and decoding throughput of attnseq, side by side in one process.

    .venv/bin/python benchmarks/bench.py              # the full run (≈ 20 min on 2 cores) → benchmarks/results.md
    .venv/bin/python benchmarks/bench.py --quick      # seconds: a few small cases, what the tests run
    .venv/bin/python benchmarks/bench.py --compile    # adds torch.compile rows (compiles take minutes)

What it measures, on the copy task (source lengths 5–40, batch 64, emb 64 / hidden 128):

- **training throughput**: real target tokens (EOS included) per second of training: forward,
  backward, gradient clipping and the optimizer step, fetching the batch included. Windows of
  ``--window`` steps (= the trainer's ``log_every_n_steps``, so each window holds one logging
  event) after a warm-up; the median over windows.
- Three loops run **in lock step** on the same batches, so that a busy machine slows all of
  them alike and their ratios stay put: the **real path** — ``Seq2SeqLitModule`` +
  ``lightning.Trainer`` from the composed Hydra config, MLflow logging to a SQLite store,
  torchmetrics, the progress bar — and, inside a callback at each of its batch starts (and timed
  apart from it), one step of a **minimal loop** over the same ``nn.Module`` configuration (its
  own DataLoader from the same data module, the optimizer from the config, clipping by norm, and
  nothing else) and one step of the **baseline**.
- The **baseline** is a textbook Bahdanau model written here: U_a h_i recomputed at every step,
  ``nn.GRU`` stepped once per token, ``torch.cat`` per step; same sizes, packed encoder. ``×base``
  is a loop's ratio to the baseline measured in the same run, at the same batching.
- **activation memory**: bytes saved for backward by one training step on the longest batch
  (distinct storages; on CUDA the allocator's peak over the step), and the process's peak RSS.
- **padding**: the fraction of source and target positions that are padding over one epoch,
  with and without length bucketing; throughput on random batches for the key cases.
- **decoding**: batched greedy decoding vs one sequence at a time, and batched beam search.
- **ablations** (full run): the step-by-step decoder loop instead of the fused one, the
  progress bar off, a DataLoader worker, and (``--compile``) torch.compile with its compile time.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import MLFlowLogger
from omegaconf import OmegaConf, open_dict
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnseq.data import datamodule as datamodule_module
from attnseq.data.batch import NO_ALIGNMENT, Batch
from attnseq.data.sampler import padding_fraction
from attnseq.data.vocab import BOS, EOS, PAD
from attnseq.model import beam_search, build_seq2seq, greedy_decode
from attnseq.model.cells import layer_parameters
from attnseq.training import build
from attnseq.training.lit_module import Seq2SeqLitModule, decode_length_limit
from attnseq.training.process import keep_freed_memory

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
BASELINE = "textbook"


# ------------------------------------------------------------------------------------ cases
@dataclass(frozen=True)
class Case:
    encoder: str  # conf/encoder: gru | lstm | bigru
    scorer: str  # conf/scorer
    decoder: str = "bahdanau"  # bahdanau | luong (input feeding) | luong-nofeed

    @property
    def name(self) -> str:
        return f"{self.encoder}/{self.scorer}/{self.decoder}"

    def overrides(self) -> list[str]:
        convention = "luong" if self.decoder.startswith("luong") else "bahdanau"
        feeding = "true" if self.decoder == "luong" else "false"
        return [f"encoder={self.encoder}", f"scorer={self.scorer}", f"decoder={convention}", f"decoder.input_feeding={feeding}"]


def all_cases() -> list[Case]:
    """scorer × decoder convention × encoder, less what the config rejects (dot with a bigru) and
    what does not exist (a query convention without attention: one `none` row per encoder)."""
    cases = []
    for encoder in ("gru", "lstm", "bigru"):
        for scorer in ("additive", "dot", "general", "concat", "scaled_dot"):
            if scorer in ("dot", "scaled_dot") and encoder == "bigru":
                continue
            cases += [Case(encoder, scorer, dec) for dec in ("bahdanau", "luong", "luong-nofeed")]
        cases.append(Case(encoder, "none"))
    return cases


KEY_ADDITIVE = Case("gru", "additive", "bahdanau")
KEY_DOT = Case("gru", "dot", "luong-nofeed")
KEY_GENERAL = Case("gru", "general", "luong-nofeed")
QUICK_CASES = [  # every scorer, decoder convention and encoder at least once
    KEY_ADDITIVE,
    KEY_DOT,
    Case("lstm", "general", "luong"),
    Case("bigru", "concat", "bahdanau"),
    Case("gru", "scaled_dot", "luong"),
    Case("gru", "none"),
]


@dataclass
class Settings:
    warmup: int
    window: int
    windows: int
    train_size: int
    decode_batches: int
    cases: list[Case]
    threads: int
    device: str
    sizes: tuple[int, int] = (64, 128)  # embedding, hidden
    compile: bool = False
    ablations: bool = True
    quick: bool = False

    @property
    def steps(self) -> int:
        return self.warmup + self.window * self.windows + 1  # +1: a step's end is the next one's start


# ------------------------------------------------------------------------------------ config
def compose_config(case: Case, settings: Settings, workdir: Path, bucketing: bool = True, extra=()):
    """The real composed config (conf/train.yaml) with the benchmark's data, sizes and outputs."""
    emb, hidden = settings.sizes
    overrides = [
        "dataset=copy",
        "dataset.train_lengths=[5,40]",
        "dataset.eval_lengths=[5,40]",
        f"dataset.train_size={settings.train_size}",
        "dataset.val_size=64",
        "dataset.test_size=64",
        f"dataset.length_bucketing={str(bucketing).lower()}",
        f"model.embedding_dim={emb}",
        f"model.hidden_size={hidden}",
        f"trainer.log_every_n_steps={settings.window}",
        f"paths.output_dir={workdir}/out",
        f"mlflow.tracking_uri=sqlite:///{workdir}/mlflow.db",
        "mlflow.experiment_name=benchmark",
        *case.overrides(),
        *extra,
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("train", overrides=overrides)


# ------------------------------------------------------------------------------------ baseline
class TextbookBahdanau(nn.Module):
    """Bahdanau attention as textbooks write it: U_a h_i recomputed at every step, one ``nn.GRU``
    call of length 1 per token, ``torch.cat`` per step. attnseq's gru/additive/bahdanau maths."""

    def __init__(self, src_vocab: int, tgt_vocab: int, emb: int, hidden: int) -> None:
        super().__init__()
        self.src_embedding = nn.Embedding(src_vocab, emb, padding_idx=PAD)
        self.tgt_embedding = nn.Embedding(tgt_vocab, emb, padding_idx=PAD)
        self.encoder = nn.GRU(emb, hidden, batch_first=True)
        self.W_a = nn.Linear(hidden, hidden, bias=False)
        self.U_a = nn.Linear(hidden, hidden, bias=False)
        self.v_a = nn.Linear(hidden, 1, bias=False)
        self.decoder = nn.GRU(emb + hidden, hidden, batch_first=True)
        self.readout = nn.Linear(hidden + hidden + emb, tgt_vocab)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> tuple[Tensor, None]:
        embedded_src = self.src_embedding(src)  # (B, T_enc, E)
        packed = pack_padded_sequence(embedded_src, src_lengths.cpu(), batch_first=True, enforce_sorted=False)
        packed_keys, state = self.encoder(packed)  # state (1, B, d)
        keys, _ = pad_packed_sequence(packed_keys, batch_first=True, total_length=src.shape[1])  # (B, T_enc, d)
        valid = torch.arange(src.shape[1], device=src.device)[None, :] < src_lengths[:, None]  # (B, T_enc)
        logits = []
        for t in range(tgt_in.shape[1]):
            embedded = self.tgt_embedding(tgt_in[:, t])  # (B, E)
            query = state[-1]  # (B, d): s_{t-1}
            energy = self.v_a(torch.tanh(self.W_a(query).unsqueeze(1) + self.U_a(keys))).squeeze(-1)  # (B, T_enc)
            weights = torch.softmax(energy.masked_fill(~valid, float("-inf")), dim=-1)  # (B, T_enc)
            context = torch.bmm(weights.unsqueeze(1), keys).squeeze(1)  # (B, d)
            output, state = self.decoder(torch.cat([embedded, context], dim=-1).unsqueeze(1), state)  # (B, 1, d)
            logits.append(self.readout(torch.cat([output.squeeze(1), context, embedded], dim=-1)))  # (B, V)
        return torch.stack(logits, dim=1), None  # (B, T_dec, V)


# ------------------------------------------------------------------------------------ loops
def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def loss_fn(logits: Tensor, target: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD)  # as Seq2SeqLitModule.loss


class Loop:
    """A minimal training loop over one model, stepped from outside: ``step()`` fetches its next
    batch from its own DataLoader and trains on it; ``durations`` holds each step's seconds."""

    def __init__(self, model: nn.Module, loader, cfg, device: str) -> None:
        self.model = model.to(device).train()
        self.optimizer = instantiate(cfg.optimizer)(model.parameters())
        self.clip = cfg.trainer.gradient_clip_val
        self.batches = iter(loader)
        self.device = device
        self.durations: list[float] = []
        self.last_shape: tuple[int, ...] = ()

    def step(self) -> None:
        _sync(self.device)
        began = time.perf_counter()
        batch = next(self.batches).to(self.device)
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.device == "cuda"):
            logits, _ = self.model(batch.src, batch.src_lengths, batch.tgt_in)
            loss = loss_fn(logits, batch.tgt_out)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        _sync(self.device)
        self.durations.append(time.perf_counter() - began)
        self.last_shape = tuple(batch.tgt_in.shape)


class LockStep(Callback):
    """At each training batch start, one step of every loop in ``loops`` (same batch order), timed
    apart: the trainer's own step ``i`` lasts from the end of these (batch ``i``) to the next batch start."""

    def __init__(self, loops: dict[str, Loop], device: str) -> None:
        self.loops = loops
        self.device = device
        self.before: list[float] = []
        self.after: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        _sync(self.device)
        self.before.append(time.perf_counter())
        for loop in self.loops.values():
            loop.step()
            if loop.last_shape != tuple(batch.tgt_in.shape):
                raise RuntimeError(f"lock step lost: {loop.last_shape} vs {tuple(batch.tgt_in.shape)}")
        self.after.append(time.perf_counter())

    def durations(self) -> list[float]:
        return [self.before[i + 1] - self.after[i] for i in range(len(self.before) - 1)]


def window_rates(durations: list[float], tokens: list[int], settings: Settings) -> list[float]:
    """Tokens per second over each window of ``settings.window`` steps after the warm-up."""
    rates = []
    for j in range(settings.windows):
        a = settings.warmup + j * settings.window
        b = a + settings.window
        if b <= len(durations):
            rates.append(sum(tokens[a:b]) / sum(durations[a:b]))
    return rates


class PerStepLogs(Seq2SeqLitModule):
    """The training step as it was before 2026-11-29 (for "What was tried"): three ``self.log``
    calls per step (~0.6 ms of Python each) where ``Seq2SeqLitModule`` now updates ``MeanMetric``s
    and logs the step loss only on the steps the logger writes."""

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        logits, _ = self.model(batch.src, batch.src_lengths, batch.tgt_in, teacher_forcing=self.teacher_forcing)
        loss = self.loss(logits, batch.tgt_out)
        size = len(batch)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=size, sync_dist=True)
        self.log("train/loss_step", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=size)
        padding = 1.0 - (batch.src_lengths.sum() + batch.tgt_lengths.sum()) / (batch.src.numel() + batch.tgt_out.numel())
        self.log("train/padding_fraction", padding, on_step=False, on_epoch=True, batch_size=size, sync_dist=True)
        return loss

    def on_train_epoch_end(self) -> None:
        pass


def per_example_collate(examples) -> Batch:
    """``attnseq.data.batch.collate`` as it was before 2026-11-29 (for "What was tried"): a few
    small tensors per example (2.2 ms for 64 copy examples, against 0.55 ms now)."""
    B = len(examples)
    T_src = max(len(ex.src) for ex in examples)
    T_tgt = max(len(ex.tgt) for ex in examples) + 1
    src = torch.full((B, T_src), PAD, dtype=torch.long)  # (B, T_src)
    tgt_in = torch.full((B, T_tgt), PAD, dtype=torch.long)  # (B, T_tgt)
    tgt_out = torch.full((B, T_tgt), PAD, dtype=torch.long)  # (B, T_tgt)
    alignment = torch.full((B, T_tgt), NO_ALIGNMENT, dtype=torch.long)  # (B, T_tgt)
    for b, ex in enumerate(examples):
        n = len(ex.tgt)
        src[b, : len(ex.src)] = torch.tensor(ex.src, dtype=torch.long)
        tgt_in[b, 0] = BOS
        tgt_in[b, 1 : n + 1] = torch.tensor(ex.tgt, dtype=torch.long)
        tgt_out[b, :n] = torch.tensor(ex.tgt, dtype=torch.long)
        tgt_out[b, n] = EOS
        if ex.alignment is not None:
            alignment[b, :n] = torch.tensor(ex.alignment, dtype=torch.long)
    src_lengths = torch.tensor([len(ex.src) for ex in examples], dtype=torch.long)  # (B,)
    tgt_lengths = torch.tensor([len(ex.tgt) + 1 for ex in examples], dtype=torch.long)  # (B,)
    return Batch(src, src_lengths, tgt_in, tgt_out, tgt_lengths, alignment)


@contextlib.contextmanager
def collate_as(function):
    """DataLoaders made inside collate with ``function`` (the data module looks ``collate`` up by name)."""
    original = datamodule_module.collate
    datamodule_module.collate = function
    try:
        yield
    finally:
        datamodule_module.collate = original


def with_autograd_gru(model: nn.Module) -> nn.Module:
    """``model`` with its whole-sequence GRUs (encoder; Luong decoder without input feeding;
    plain decoder) run by ``torch.gru`` under autograd instead of ``gru_sequence``'s hand-written
    backward pass (for "What was tried")."""
    encoder, decoder = model.encoder, model.decoder

    def gru_direction(inputs: Tensor, reverse: bool) -> Tensor:
        weights = list(layer_parameters(encoder.rnn, reverse=reverse))
        h0 = inputs.new_zeros(1, inputs.shape[0], encoder.hidden_size)  # (1, B, d)
        return torch.gru(inputs, h0, weights, True, 1, 0.0, True, False, True)[0]  # (B, T, d)

    encoder._gru_direction = gru_direction
    decoder._run_rnn = lambda inputs, state: decoder.rnn(inputs, state)[0]  # (B, T, d_s)
    return model


def lightning_run(
    cfg, datamodule, loops: dict[str, Loop], settings: Settings, progress: bool = True, module_class=Seq2SeqLitModule
) -> list[float]:
    """The real training path with ``loops`` in lock step; returns the trainer's step durations."""
    module = build.build_module(cfg, datamodule, module_class)
    logger = MLFlowLogger(experiment_name=cfg.mlflow.experiment_name, tracking_uri=cfg.mlflow.tracking_uri)
    clock = LockStep(loops, settings.device)
    trainer_args = OmegaConf.to_container(cfg.trainer, resolve=True)
    if not progress:
        trainer_args["enable_progress_bar"] = False
    if settings.device == "cuda":
        trainer_args.update(accelerator="gpu", devices=1, precision="bf16-mixed")
    trainer_args.update(
        max_steps=settings.steps,
        limit_val_batches=0,  # validation is not training throughput
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer = L.Trainer(**trainer_args, logger=logger, callbacks=[clock], default_root_dir=cfg.paths.output_dir)
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        trainer.fit(module, datamodule=datamodule)  # the progress bar renders, into nothing
    return clock.durations()


def activation_bytes(model: nn.Module, batch, device: str) -> int:
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


# ------------------------------------------------------------------------------------ results
@dataclass
class Row:
    label: str
    rates: dict[str, list[float]] = field(default_factory=dict)  # loop → window throughputs
    activations: int | None = None
    varies: str = "minimal"  # for an ablation: the loop that differs from the kept variant

    def median(self, loop: str) -> float | None:
        values = self.rates.get(loop)
        return statistics.median(values) if values else None

    def ratio(self, loop: str, other: str = BASELINE) -> float | None:
        a, b = self.median(loop), self.median(other)
        return None if a is None or not b else a / b


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def machine_line(device: str) -> str:
    import lightning
    import mlflow

    cpu = platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    accelerator = f", GPU {torch.cuda.get_device_name()}" if device == "cuda" else ""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({cpu}){accelerator}, device {device}, torch {torch.__version__} "
        f"({torch.backends.cpu.get_cpu_capability()}), torch.get_num_threads() = {torch.get_num_threads()}, "
        f"lightning {lightning.__version__}, mlflow {mlflow.__version__}, python {platform.python_version()}; "
        f"load average at the end {load}"
    )


def git_state() -> str:
    try:
        run = lambda *args: subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()  # noqa: E731
        return run("rev-parse", "HEAD") + (" + uncommitted changes" if run("status", "--porcelain") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ------------------------------------------------------------------------------------ the run
def run(settings: Settings, log=print, workdir: Path | None = None) -> dict:
    """Every measurement; ``render`` turns the result into Markdown. The MLflow store and the
    trainer's outputs go to ``workdir`` (default: a temporary folder, removed afterwards)."""
    torch.set_num_threads(settings.threads)
    results_allocator = keep_freed_memory()  # as train() does: every loop, the baseline's too
    warnings.filterwarnings("ignore")  # Lightning's advice on workers and logging intervals
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)
    started = time.time()
    results: dict = {"settings": settings, "rows": {}, "allocator_keeps_freed_memory": results_allocator}
    rows: dict[str, Row] = results["rows"]
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="attnseq-bench-")))
        cfgs = {case: compose_config(case, settings, workdir) for case in settings.cases}
        base_cfg = cfgs[settings.cases[0]]
        datamodule = build.build_datamodule(base_cfg)
        datamodule.setup()
        random_dm = build.build_datamodule(compose_config(settings.cases[0], settings, workdir, bucketing=False))
        random_dm.setup()
        epochs = {"bucketed": list(datamodule.train_dataloader()), "random": list(random_dm.train_dataloader())}
        tokens = {kind: [int(b.tgt_lengths.sum()) for b in batches] for kind, batches in epochs.items()}
        if len(epochs["bucketed"]) < settings.steps:
            raise ValueError(f"{len(epochs['bucketed'])} batches per epoch < {settings.steps} steps: raise train_size")
        results["padding"] = {
            kind: 1.0 - sum(int(b.src_lengths.sum()) + int(b.tgt_lengths.sum()) for b in batches)
            / sum(b.src.numel() + b.tgt_out.numel() for b in batches)
            for kind, batches in epochs.items()
        }
        results["padding_worst_batch"] = max(padding_fraction(b) for b in epochs["bucketed"])
        longest = max(epochs["bucketed"], key=lambda b: b.tgt_in.numel())
        vocab = (len(datamodule.src_vocab), len(datamodule.tgt_vocab))

        def model(case: Case) -> nn.Module:
            torch.manual_seed(0)
            return build_seq2seq(build.model_config(cfgs[case], *vocab))

        def textbook() -> nn.Module:
            torch.manual_seed(0)
            return TextbookBahdanau(*vocab, *settings.sizes)

        def record(label: str, loop: str, durations: list[float], kind: str = "bucketed") -> None:
            rows.setdefault(label, Row(label)).rates.setdefault(loop, []).extend(window_rates(durations, tokens[kind], settings))

        def measure(label: str, cfg, loops: dict[str, Loop], dm=datamodule, **options) -> None:
            """One trainer run with ``loops`` in lock step: the row ``label`` gets the real path (and
            the minimal loop), every other loop its own row, all with this run's baseline."""
            began = time.perf_counter()
            record(label, "real", lightning_run(cfg, dm, loops, settings, **options))
            baseline = loops[BASELINE].durations
            record(BASELINE, "minimal", baseline)
            for name, loop in loops.items():
                if name != BASELINE:
                    row = label if name == "minimal" else name
                    record(row, "minimal", loop.durations)
                    record(row, BASELINE, baseline)
            record(label, BASELINE, baseline)
            row = rows[label]
            log(f"{label:45s} real {fmt(row.median('real')):>7s}  minimal {fmt(row.median('minimal')):>7s}  "
                f"{BASELINE} {fmt(row.median(BASELINE)):>7s} tok/s  ({time.perf_counter() - began:.0f} s)")

        def loops_for(case: Case, cfg, **extra: nn.Module) -> dict[str, Loop]:
            loops = {"minimal": Loop(model(case), datamodule.train_dataloader(), cfg, settings.device),
                     BASELINE: Loop(textbook(), datamodule.train_dataloader(), cfg, settings.device)}
            loops.update({name: Loop(m, datamodule.train_dataloader(), cfg, settings.device) for name, m in extra.items()})
            return loops

        for case in settings.cases:
            extra, cfg = {}, cfgs[case]
            if settings.ablations and case in (KEY_ADDITIVE, Case("gru", "additive", "luong"), Case("lstm", "additive", "bahdanau")):
                stepwise = model(case)
                stepwise.decoder.can_fuse = lambda: False  # the step-by-step loop that decoding runs
                extra[f"{case.name} (step-by-step decoder loop)"] = stepwise
            if settings.ablations and case in (KEY_DOT, Case("gru", "none")):
                extra[f"{case.name} (nn.GRU's autograd backward)"] = with_autograd_gru(model(case))
            loops = loops_for(case, cfg, **extra)
            if settings.ablations and case == KEY_DOT:
                fused_adam = cfg.copy()
                with open_dict(fused_adam):
                    fused_adam.optimizer.fused = True
                loops[f"{case.name} (Adam fused=True)"] = Loop(model(case), datamodule.train_dataloader(), fused_adam, settings.device)
            measure(case.name, cfg, loops)
            rows[case.name].activations = activation_bytes(model(case), longest, settings.device)
            if settings.ablations and case in (KEY_ADDITIVE, KEY_DOT):
                label = f"{case.name} (training step with a self.log per step, before)"
                measure(label, cfg, loops_for(case, cfg), module_class=PerStepLogs)
                rows[label].varies = "real"
                with collate_as(per_example_collate):  # every loop of the run, the baseline's too
                    label = f"{case.name} (per-example collate, before)"
                    measure(label, cfg, loops_for(case, cfg))
                    rows[label].varies = "real"

        if settings.ablations and KEY_ADDITIVE in cfgs:
            cfg = cfgs[KEY_ADDITIVE]
            label = f"{KEY_ADDITIVE.name} (progress bar off)"
            measure(label, cfg, loops_for(KEY_ADDITIVE, cfg), progress=False)
            rows[label].varies = "real"
            workers_cfg = OmegaConf.merge(cfg, {"dataset": {"num_workers": 1}})
            workers_dm = build.build_datamodule(workers_cfg)
            workers_dm.setup()
            label = f"{KEY_ADDITIVE.name} (1 DataLoader worker)"
            measure(label, workers_cfg, loops_for(KEY_ADDITIVE, cfg), dm=workers_dm)
            rows[label].varies = "real"

        # Random (unbucketed) batches: the baseline and the key cases, in lock step without a trainer.
        random_cases = [c for c in (KEY_ADDITIVE, KEY_DOT) if c in cfgs]
        loops = {BASELINE: Loop(textbook(), random_dm.train_dataloader(), base_cfg, settings.device)}
        loops.update({c.name: Loop(model(c), random_dm.train_dataloader(), cfgs[c], settings.device) for c in random_cases})
        for _ in range(settings.steps - 1):
            for loop in loops.values():
                loop.step()
        for name, loop in loops.items():
            record(name, "random", loop.durations, kind="random")
        rows[BASELINE].activations = activation_bytes(textbook(), longest, settings.device)

        if settings.compile:
            results["compile"] = compile_rows(settings, cfgs, model, textbook, datamodule, tokens["bucketed"], log)
        decode_case = KEY_ADDITIVE if KEY_ADDITIVE in cfgs else settings.cases[0]
        trained = loops_for(decode_case, cfgs[decode_case])["minimal"]
        for _ in range(min(settings.steps, 40)):
            trained.step()  # a little training, so outputs end with EOS as in evaluation
        results["decoding"] = decoding(settings, trained.model, datamodule, cfgs[decode_case], log)
        results["decode_case"] = decode_case.name
    results["machine"] = machine_line(settings.device)
    results["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results["minutes"] = (time.time() - started) / 60
    return results


def compile_rows(settings: Settings, cfgs, model, textbook, datamodule, tokens, log) -> dict:
    """torch.compile (dynamic shapes) of the whole model in the minimal loop, in lock step with
    the uncompiled one and the baseline; the compile time is the first step's."""
    out = {}
    for case in (KEY_ADDITIVE, KEY_DOT):
        if case not in cfgs:
            continue
        cfg = cfgs[case]
        compiled = Loop(torch.compile(model(case), dynamic=True), datamodule.train_dataloader(), cfg, settings.device)
        plain = Loop(model(case), datamodule.train_dataloader(), cfg, settings.device)
        base = Loop(textbook(), datamodule.train_dataloader(), cfg, settings.device)
        for _ in range(settings.steps - 1):
            for loop in (compiled, plain, base):
                loop.step()
        rates = {name: statistics.median(window_rates(loop.durations, tokens, settings))
                 for name, loop in (("compiled", compiled), ("plain", plain), ("base", base))}
        out[case.name] = {"compile_s": compiled.durations[0], **rates}
        log(f"{case.name} torch.compile: first step {compiled.durations[0]:.0f} s, {rates}")
    return out


@torch.no_grad()
def decoding(settings: Settings, model: nn.Module, datamodule, cfg, log) -> dict:
    """Greedy decoding of the same sources in batches of 64 and one at a time; beam search (K=4)
    in batches. Sources from the validation-style sorted loader, limits as in evaluation."""
    device = settings.device
    model.to(device).eval()
    examples = datamodule.train_examples[: 64 * settings.decode_batches]
    batches = [b.to(device) for b in datamodule.make_dataloader(examples, 64)]
    ratio, extra = cfg.decode.max_length_ratio, cfg.decode.max_length_extra

    def limit(lengths: Tensor) -> int:
        return decode_length_limit(lengths, ratio, extra)

    def batched(batch) -> int:
        return int(greedy_decode(model, batch.src, batch.src_lengths, max_length=limit(batch.src_lengths)).lengths.sum())

    def one_at_a_time(batch) -> int:
        emitted = 0
        for b in range(len(batch)):
            n = int(batch.src_lengths[b])
            src, lengths = batch.src[b : b + 1, :n], batch.src_lengths[b : b + 1]
            emitted += int(greedy_decode(model, src, lengths, max_length=limit(lengths)).lengths.sum())
        return emitted

    def beam(batch) -> int:
        return int(beam_search(model, batch.src, batch.src_lengths, beam_size=4, max_length=limit(batch.src_lengths)).lengths.sum())

    batched(batches[0])  # warm-up
    result = {}
    for name, fn in (("greedy, batches of 64", batched), ("greedy, one sequence at a time", one_at_a_time),
                     ("beam search K=4, batches of 64", beam)):
        _sync(device)
        began = time.perf_counter()
        emitted = sum(fn(batch) for batch in batches)
        _sync(device)
        seconds = time.perf_counter() - began
        result[name] = {"seq_s": len(examples) / seconds, "tok_s": emitted / seconds}
        log(f"decoding  {name:32s} {len(examples) / seconds:8.1f} sequences/s")
    return result


# ------------------------------------------------------------------------------------ report
def render(results: dict, command: str) -> str:
    settings: Settings = results["settings"]
    rows: dict[str, Row] = results["rows"]
    emb, hidden = settings.sizes
    lines = [
        "# attnseq training and decoding throughput",
        "",
        f"- command: `{command}`",
        f"- commit: {git_state()}",
        f"- machine: {results['machine']}; peak RSS {results['max_rss_mib']:.0f} MiB; {results['minutes']:.1f} min in all",
        f"- allocator: glibc keeps freed memory for reuse (`attnseq.training.process.keep_freed_memory`, as train() "
        f"does): {'yes' if results.get('allocator_keeps_freed_memory') else 'no (not glibc)'}",
        f"- task: copy, source lengths 5–40, batch 64, emb {emb} / hidden {hidden}, Adam (lr from the config) + "
        f"gradient clipping 1.0; {settings.windows} windows of {settings.window} steps after {settings.warmup} "
        "warm-up steps; medians over windows",
        "- `real path`: Seq2SeqLitModule + lightning.Trainer (conf/trainer/cpu.yaml, logging every "
        f"{settings.window} steps, Lightning's default progress bar as in train()) + MLFlowLogger on SQLite; "
        "`minimal`: a bare loop over the same model and batches; both in lock step with the "
        f"`{BASELINE}` baseline (Bahdanau additive as textbooks write it: U_a h_i re-projected every step, "
        "nn.GRU stepped per token); `×base` is the ratio to that baseline in the same run; "
        "`overhead` = minimal / real − 1",
        "",
        "## Training throughput (target tokens/s, length-bucketed batches)",
        "",
        "| encoder / scorer / decoder | real path | ×base | minimal loop | ×base | overhead | activations MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    base_row = rows[BASELINE]
    mib = lambda row: "—" if row.activations is None else f"{row.activations / 2**20:.1f}"  # noqa: E731
    lines.append(f"| {BASELINE} (all runs pooled) | — | — | {fmt(base_row.median('minimal'))} | 1.00× | — | {mib(base_row)} |")
    for case in settings.cases:
        row = rows[case.name]
        overhead = row.ratio("minimal", "real")
        lines.append(
            f"| {row.label} | {fmt(row.median('real'))} | {fmt_ratio(row.ratio('real'))} | {fmt(row.median('minimal'))} | "
            f"{fmt_ratio(row.ratio('minimal'))} | {'—' if overhead is None else f'{100 * (overhead - 1):+.1f}%'} | {mib(row)} |"
        )
    lines += [
        "",
        "`bahdanau`: query s_{t-1}, the context feeds the RNN; `luong`: query s_t, with input feeding; "
        "`luong-nofeed`: without it (the RNN runs over all steps in one call, attention in one call).",
        "",
        "## Padding and length bucketing",
        "",
        f"Padding over one training epoch (source + target positions): **{100 * results['padding']['bucketed']:.1f}%** "
        f"with length bucketing (worst batch {100 * results['padding_worst_batch']:.1f}%), "
        f"{100 * results['padding']['random']:.1f}% with random batches.",
        "",
        "| minimal loop | bucketed tok/s | random batches tok/s | ×base (random) | bucketing lift |",
        "|---|---:|---:|---:|---:|",
    ]
    random_base = base_row.median("random")
    for label, row in rows.items():
        if row.median("random") is None:
            continue
        random_rate, bucketed = row.median("random"), row.median("minimal")
        lift = None if bucketed is None else bucketed / random_rate
        lines.append(f"| {label} | {fmt(bucketed)} | {fmt(random_rate)} | {fmt_ratio(random_rate / random_base)} | {fmt_ratio(lift)} |")
    ablations = [row for label, row in rows.items() if "(" in label]
    if ablations or results.get("compile"):
        lines += ["", "## What was tried (measured in lock step with the kept variant and the baseline)", "",
                  "| variant | loop | tok/s | ×base | vs kept (×base / kept ×base) | overhead |",
                  "|---|---|---:|---:|---:|---:|"]
        for row in ablations:
            kept, loop = rows.get(row.label.split(" (")[0]), row.varies
            mine, theirs = row.ratio(loop), None if kept is None else kept.ratio(loop)
            versus = None if mine is None or not theirs else mine / theirs  # a ratio of ×base ratios
            overhead = row.ratio("minimal", "real") if loop == "real" else None
            shown = "—" if overhead is None else f"{100 * (overhead - 1):+.1f}%"
            lines.append(f"| {row.label} | {loop} | {fmt(row.median(loop))} | {fmt_ratio(mine)} | {fmt_ratio(versus)} | {shown} |")
        for label, entry in results.get("compile", {}).items():
            lines.append(f"| {label} (torch.compile, dynamic, first step {entry['compile_s']:.0f} s) | minimal | "
                         f"{fmt(entry['compiled'])} | {fmt_ratio(entry['compiled'] / entry['base'])} | "
                         f"{fmt_ratio(entry['compiled'] / entry['plain'])} |")
    decoded = results["decoding"]
    single = decoded["greedy, one sequence at a time"]
    lines += ["", f"## Decoding (evaluation mode; {results['decode_case']} after a few training steps)", "",
              "| decoding | sequences/s | tokens/s | vs one at a time |", "|---|---:|---:|---:|"]
    for name, entry in decoded.items():
        lines.append(f"| {name} | {entry['seq_s']:,.1f} | {entry['tok_s']:,.0f} | {fmt_ratio(entry['seq_s'] / single['seq_s'])} |")
    lines += ["", "## Targets", "", *targets(results)]
    return "\n".join(lines) + "\n"


def targets(results: dict) -> list[str]:
    rows: dict[str, Row] = results["rows"]
    out = []

    def check(text: str, value: float | None, goal: float, at_most: bool = False, percent: bool = False) -> None:
        if value is None:
            out.append(f"- {text}: not measured in this run")
            return
        met = value <= goal if at_most else value >= goal
        shown, unit = (f"{value:.1f}%", "%") if percent else (f"{value:.2f}×", "×")
        out.append(f"- {text}: **{shown}** (goal {'≤' if at_most else '≥'} {goal:g}{unit}): {'met' if met else 'NOT met'}")

    def real_ratio(case: Case) -> float | None:
        return rows[case.name].ratio("real") if case.name in rows else None

    check(f"Bahdanau additive ({KEY_ADDITIVE.name}), real path vs the textbook baseline", real_ratio(KEY_ADDITIVE), 1.8)
    for case in (KEY_DOT, KEY_GENERAL):
        check(f"Luong {case.scorer} without input feeding ({case.name}), real path vs the baseline", real_ratio(case), 3.0)
    overheads = [(100 * (r - 1), label) for label, row in rows.items() if "(" not in label
                 and (r := row.ratio("minimal", "real")) is not None]
    if overheads:
        worst, label = max(overheads)
        check(f"framework overhead, median over cases ({statistics.median(o for o, _ in overheads):+.1f}%); worst "
              f"({label})", worst, 10.0, at_most=True, percent=True)
    decoded = results["decoding"]
    check("batched greedy decoding vs one sequence at a time",
          decoded["greedy, batches of 64"]["seq_s"] / decoded["greedy, one sequence at a time"]["seq_s"], 5.0)
    check("padding with length bucketing", 100 * results["padding"]["bucketed"], 10.0, at_most=True, percent=True)
    return out


def make_settings(args: argparse.Namespace) -> Settings:
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    threads = args.threads or torch.get_num_threads()
    if args.quick:
        return Settings(warmup=1, window=2, windows=2, train_size=64 * 8, decode_batches=1, cases=list(QUICK_CASES),
                        threads=threads, device=device, sizes=(16, 32), compile=args.compile, ablations=False, quick=True)
    return Settings(warmup=args.warmup, window=args.window, windows=args.windows,
                    train_size=64 * (args.warmup + args.window * args.windows + 2), decode_batches=4,
                    cases=all_cases() if args.cases == "all" else [*QUICK_CASES, KEY_GENERAL],
                    threads=threads, device=device, compile=args.compile)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="six small cases, a few steps: seconds (what the tests run)")
    parser.add_argument("--cases", choices=("all", "key"), default="all", help="the full matrix, or the quick cases and gru/general/luong-nofeed")
    parser.add_argument("--warmup", type=int, default=5, help="steps before the first timed window")
    parser.add_argument("--window", type=int, default=25, help="steps per timed window, and the logging interval")
    parser.add_argument("--windows", type=int, default=3, help="timed windows per run")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (bf16 autocast on CUDA)")
    parser.add_argument("--compile", action="store_true", help="add torch.compile rows (compiles take minutes)")
    parser.add_argument("--out", type=Path, default=None, help="the Markdown file (default: benchmarks/results.md; none with --quick)")
    args = parser.parse_args(argv)
    settings = make_settings(args)
    results = run(settings, log=lambda line: print(line, file=sys.stderr, flush=True))
    shown_args = " ".join(argv if argv is not None else sys.argv[1:])
    report = render(results, f"python benchmarks/bench.py {shown_args}".strip())
    print(report)
    out = args.out or (None if args.quick else REPO / "benchmarks" / "results.md")
    if out is not None:
        out.write_text(report)
        print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
