"""OpenNMT-py 3.5.1 beside attnseq: training throughput (target tokens per second) and decoding throughput
(sentences per second) of the same models on the same data, one after the other on the same machine.

    .venv/bin/python benchmarks/opennmt_peer.py               # installs OpenNMT-py 3.5.1 in a venv of its own first
    .venv/bin/python benchmarks/opennmt_peer.py --onmt-bin /path/to/its/venv/bin
    .venv/bin/python benchmarks/opennmt_peer.py --quick       # a few steps of one pair: the tests' run

- **Data**: the benchmark's copy task (lengths 5-40 over 10 symbols, ``benchmarks/cases.py``), made by attnseq
  from its config and written as plain files (``train.src|tgt``, ``test.src``); attnseq makes the same split
  itself from the same config, OpenNMT-py reads the files (its vocabulary from them, ``onmt_build_vocab``).
- **The models** (``PAIRS``): a GRU encoder and decoder, embeddings 64, hidden 128, one layer, no dropout,
  Adam at 1e-3 with gradients clipped at norm 1, batches of 64 sentences. OpenNMT-py's RNN decoder attends
  after its RNN step (Luong's convention): ``global_attention: mlp`` with input feeding is attnseq's
  ``decoder=luong scorer=additive``, and ``general`` without input feeding is ``decoder=luong
  decoder.input_feeding=false scorer=general``. Issue 28 compares attnseq's Bahdanau decoder
  (``decoder=bahdanau scorer=additive``) with the first, so it is measured beside it too.
- **Training**: ``onmt_train`` and ``train.py``, each for ``--steps`` batches, with the same threads
  (``OMP_NUM_THREADS`` and ``threads=``) and data loading in the training process for both (OpenNMT-py's
  ``num_workers: 0``; attnseq's default). Throughput is over the same window of each run, steps
  ``REPORT_EVERY`` to ``--steps`` (start-up and the first batches left out): OpenNMT-py's own per-report
  target tokens per second (non-padding target tokens, EOS included), combined over the window; attnseq's
  target tokens (EOS included; the epoch's mean per batch) over the seconds between its first and last
  ``train/loss_step`` in MLflow.
- **Decoding**: each trained model decodes the test split's 2,000 sources of lengths 5-40, greedy and beam 5,
  through each project's command line (``onmt_translate -src``; ``translate.py run_id=… < sources``), outputs
  of at most twice the source's length for attnseq (``decode.max_length_ratio=2``) and 80 tokens, twice the
  longest source, for OpenNMT-py (``-max_length``; the report gives each side's mean output length); the
  translation alone (the model loaded: OpenNMT-py's ``-report_time``, attnseq's ``Translator`` timed here)
  and the wall seconds from launch to exit.
- The two alternate in every repeat (OpenNMT-py first in even repeats), so that a machine slowing down
  slows both; medians over ``--repeats``, ratios attnseq / OpenNMT-py, Welch's t-test on the repeats.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import NamedTuple

import yaml
from cases import Case  # noqa: E402  (benchmarks/ is first on sys.path for its scripts)

REPO = Path(__file__).resolve().parents[1]
ONMT = "OpenNMT-py==3.5.1"
TORCH = "torch==2.13.0"  # the CPU wheel on this disk
# OpenNMT-py 3.5.1 pins torch<2.3, which PyPI serves only as a CUDA build of several GB. Installed without its
# pins beside torch 2.13 it trains and translates on the CPU; onmt.transforms imports every transform at start,
# so these are what it needs to start (its own requirements, less torch).
ONMT_NEEDS = ("configargparse", "pyyaml", "sacrebleu", "six", "pyonmttok>=1.37,<2", "rapidfuzz", "spacy",
              "tensorboard>=2.3", "pyahocorasick", "waitress", "flask", "fasttext-wheel", "ctranslate2>=4,<5")
VENV = Path.home() / ".cache" / "attnseq" / "opennmt-py-3.5.1"
PEER = "OpenNMT-py 3.5.1"
REPORT_EVERY = 50  # OpenNMT-py's report_every = attnseq's trainer.log_every_n_steps: the window's unit
EMB, HIDDEN, BATCH = 64, 128, 64
LEARNING_RATE, CLIP = 0.001, 1.0  # Adam's rate, the gradients' norm clipped at
BEAMS = (1, 5)
MAX_LENGTH_RATIO = 2.0  # attnseq's decode.max_length_ratio for decoding; OpenNMT-py: max_length 80 = 2 × 40
GOALS = {"general, no input feeding": 1.5}  # issue 28: attnseq's tokens/s at least this × OpenNMT-py's


@dataclass(frozen=True)
class Pair:
    """One OpenNMT-py model and the attnseq cases that compute the same function (the first) or that issue 28
    sets beside it."""

    name: str
    onmt: dict  # OpenNMT-py's options for it
    cases: tuple[Case, ...]


PAIRS = (
    Pair("additive (mlp), input feeding", {"global_attention": "mlp", "input_feed": 1},
         (Case("gru", "additive", "luong"), Case("gru", "additive", "bahdanau"))),
    Pair("general, no input feeding", {"global_attention": "general", "input_feed": 0},
         (Case("gru", "general", "luong-nofeed"),)),
)


@dataclass(frozen=True)
class Sizes:
    steps: int  # training batches
    decode_size: int  # sources decoded
    repeats: int
    pairs: tuple[Pair, ...] = PAIRS
    beams: tuple[int, ...] = BEAMS


FULL = Sizes(steps=400, decode_size=2000, repeats=3)
QUICK = Sizes(steps=2 * REPORT_EVERY, decode_size=64, repeats=1, pairs=PAIRS[1:], beams=(1,))


@dataclass(frozen=True)
class Decoding:
    """One decoding of the test sources through a command line."""

    wall_s: float  # launch to exit
    own_s: float  # the translation alone, the model loaded (OpenNMT-py's report_time; attnseq's Translator)
    output_words: float  # mean output tokens per source (EOS not counted)


@dataclass
class Result:
    """One model's measurements over the repeats."""

    tokens_per_s: list[float] = field(default_factory=list)  # each training's, over the window
    decodings: dict[int, list[Decoding]] = field(default_factory=dict)  # beam size → each repeat's


# ---- the data


def task_overrides(sizes: Sizes, seed: int = 0) -> list[str]:
    """The copy task as the benchmark trains it, ``steps`` batches of ``BATCH`` in one epoch."""
    return ["dataset=copy", "dataset.train_lengths=[5,40]", "dataset.eval_lengths=[5,40]",
            f"dataset.train_size={sizes.steps * BATCH}", "dataset.val_size=64",
            f"dataset.test_size={sizes.decode_size}", f"dataset.batch_size={BATCH}", f"model.embedding_dim={EMB}",
            f"model.hidden_size={HIDDEN}", "model.dropout=0.0", f"optimizer.lr={LEARNING_RATE}",
            f"trainer.gradient_clip_val={CLIP}", f"seed={seed}"]


def export(sizes: Sizes, folder: Path) -> float:
    """The task's training split and test sources as plain files in ``folder``; the training's target tokens
    per batch, EOS included (what attnseq's tokens/s counts)."""
    from attnseq.cli import compose_command_line
    from attnseq.config import validate_train
    from attnseq.training.build import build_datamodule

    [cfg] = compose_command_line("train", task_overrides(sizes))
    datamodule = build_datamodule(validate_train(cfg))
    datamodule.setup()
    folder.mkdir(parents=True, exist_ok=True)
    splits = {"train": datamodule.train_examples, "test": datamodule.test_examples}
    for split, examples in splits.items():
        for side in ("src", "tgt"):
            (folder / f"{split}.{side}").write_text("".join(" ".join(getattr(e, side)) + "\n" for e in examples))
    return sum(len(e.tgt) + 1 for e in splits["train"]) / sizes.steps


# ---- OpenNMT-py


def onmt_bin(given: str | None, log) -> Path:
    """The folder of OpenNMT-py's commands: ``given``, or ``VENV``'s, made with pip on first use."""
    if given is not None:
        return Path(given)
    folder = VENV / "bin"
    if not (folder / "onmt_train").exists():
        log(f"installing {ONMT} with {TORCH} into {VENV} (once; a few minutes)")
        pip = [str(folder / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([*pip, TORCH, *ONMT_NEEDS], check=True)
        subprocess.run([*pip, "--no-deps", ONMT], check=True)
    return folder


def onmt_config(pair: Pair, data: Path, workdir: Path, sizes: Sizes) -> dict:
    return {
        "save_data": str(workdir), "src_vocab": str(workdir / "vocab.src"), "tgt_vocab": str(workdir / "vocab.tgt"),
        "overwrite": True,
        "data": {"corpus_1": {"path_src": str(data / "train.src"), "path_tgt": str(data / "train.tgt")}},
        "save_model": str(workdir / "model"), "seed": 0, "num_workers": 0,
        "encoder_type": "rnn", "decoder_type": "rnn", "rnn_type": "GRU", "layers": 1, "hidden_size": HIDDEN,
        "word_vec_size": EMB, "dropout": 0.0, "bridge": False, **pair.onmt,
        "batch_size": BATCH, "batch_type": "sents", "optim": "adam", "learning_rate": LEARNING_RATE,
        "max_grad_norm": CLIP,
        "train_steps": sizes.steps, "report_every": REPORT_EVERY, "save_checkpoint_steps": sizes.steps,
        "valid_steps": 10 * sizes.steps,  # no validation inside the run
    }


TRUSTED_CHECKPOINTS = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
"""OpenNMT-py 3.5.1 loads its checkpoints (which hold an ``argparse.Namespace``) with ``torch.load``'s default,
weights only since torch 2.6; this variable of torch's turns that default off for ``onmt_translate``, which
reads only the checkpoint this benchmark just trained."""
REPORT = re.compile(r"Step\s+(\d+)/\s*\d+;.*?bsz:\s*\d+/(\d+)/\d+;\s*[\d.]+/\s*([\d.]+) tok/s")
TRANSLATION_TIME = re.compile(r"Total translation time \(s\):\s*([\d.]+)")


def onmt_rate(log_text: str) -> float:
    """Target tokens per second over the reports after the first (steps ``REPORT_EVERY`` + 1 to the end):
    each report's window has ``REPORT_EVERY`` batches of its mean target tokens, at its tokens/s."""
    windows = [(int(step), float(per_batch) * REPORT_EVERY, float(rate))
               for step, per_batch, rate in REPORT.findall(log_text)]
    later = [(tokens, rate) for step, tokens, rate in windows if step > REPORT_EVERY]
    if not later:
        raise RuntimeError(f"no training report after step {REPORT_EVERY} in OpenNMT-py's log:\n{log_text[-2000:]}")
    return sum(tokens for tokens, _ in later) / sum(tokens / rate for tokens, rate in later)


def run(command: list[str], log_path: Path, threads: int, stdin: Path | None = None,
        env: dict[str, str] | None = None) -> tuple[float, str]:
    """``command`` from launch to exit (wall seconds) and its standard error; its standard output is kept in
    ``log_path`` and its standard error beside it (``.err``); raises with the error's tail."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ATTNSEQ_", "PYTHON"))} | (env or {})
    env["OMP_NUM_THREADS"] = str(threads)
    errors = log_path.with_suffix(".err")
    started = time.perf_counter()
    with open(log_path, "w") as out, open(errors, "w") as err, open(stdin or os.devnull) as source:
        done = subprocess.run(command, stdin=source, stdout=out, stderr=err, env=env, cwd=log_path.parent)
    seconds = time.perf_counter() - started
    text = log_path.read_text() + errors.read_text()
    if done.returncode != 0:
        raise RuntimeError(f"{Path(command[0]).name} exited with {done.returncode}:\n{text[-3000:]}")
    return seconds, text


def mean_words(path: Path) -> float:
    """The mean tokens per line of an output file."""
    lines = path.read_text().splitlines()
    return sum(len(line.split()) for line in lines) / max(len(lines), 1)


def train_onmt(bin_dir: Path, pair: Pair, data: Path, workdir: Path, sizes: Sizes, threads: int) -> tuple[float, Path]:
    """One OpenNMT-py training: its tokens/s over the window, and its checkpoint."""
    workdir.mkdir(parents=True)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(onmt_config(pair, data, workdir, sizes), sort_keys=False))
    run([str(bin_dir / "onmt_build_vocab"), "-config", str(config), "-n_sample", "-1"], workdir / "vocab.log", threads)
    _, text = run([str(bin_dir / "onmt_train"), "-config", str(config)], workdir / "train.log", threads)
    return onmt_rate(text), workdir / f"model_step_{sizes.steps}.pt"


def decode_onmt(bin_dir: Path, model: Path, data: Path, workdir: Path, beam: int, threads: int) -> Decoding:
    """``onmt_translate`` of the test sources, greedy or beam search."""
    output = workdir / f"onmt-beam{beam}.txt"
    seconds, text = run([str(bin_dir / "onmt_translate"), "-model", str(model), "-src", str(data / "test.src"),
                         "-output", str(output), "-beam_size", str(beam), "-batch_size", str(BATCH),
                         "-max_length", str(int(MAX_LENGTH_RATIO * 40)), "-report_time"],
                        workdir / f"translate-beam{beam}.log", threads, env=TRUSTED_CHECKPOINTS)
    own = TRANSLATION_TIME.search(text)
    if own is None:
        raise RuntimeError(f"no translation time in onmt_translate's output:\n{text[-2000:]}")
    return Decoding(seconds, float(own.group(1)), mean_words(output))


# ---- attnseq


def train_attnseq(case: Case, workdir: Path, sizes: Sizes, threads: int, tokens_per_batch: float) -> tuple[float, str]:
    """One ``train.py`` training: its tokens/s over the window (MLflow's ``train/loss_step`` timestamps), and
    the run's id."""
    from mlflow.tracking import MlflowClient

    workdir.mkdir(parents=True)
    uri = f"sqlite:///{workdir}/mlflow.db"
    run([sys.executable, str(REPO / "train.py"), *case.overrides(), *task_overrides(sizes), f"threads={threads}",
         "trainer.max_epochs=1", f"trainer.log_every_n_steps={REPORT_EVERY}", "trainer.enable_progress_bar=false",
         f"decode.max_length_ratio={MAX_LENGTH_RATIO}", "decode.max_length_extra=0", f"mlflow.tracking_uri={uri}",
         "mlflow.experiment_name=opennmt-peer", f"hydra.run.dir={workdir / 'out'}"],
        workdir / "train.log", threads)
    client = MlflowClient(uri)
    [found] = client.search_runs([client.get_experiment_by_name("opennmt-peer").experiment_id])
    losses = sorted(client.get_metric_history(found.info.run_id, "train/loss_step"), key=lambda m: m.step)
    if len(losses) < 2:
        raise RuntimeError(f"{case.name}: fewer than two train/loss_step records; raise --steps")
    batches = losses[-1].step - losses[0].step
    return tokens_per_batch * batches / ((losses[-1].timestamp - losses[0].timestamp) / 1000), found.info.run_id


def decode_attnseq(run_id: str, workdir: Path, data: Path, beam: int, threads: int) -> Decoding:
    """``translate.py`` of the test sources (on its standard input), greedy or beam search."""
    output = workdir / f"translate-beam{beam}.log"
    seconds, _ = run([sys.executable, str(REPO / "translate.py"), f"run_id={run_id}",
                      f"mlflow.tracking_uri=sqlite:///{workdir}/mlflow.db", f"beam_size={beam}",
                      f"threads={threads}"],
                     output, threads, stdin=data / "test.src")
    return Decoding(seconds, translation_s(run_id, workdir, data, beam, threads), mean_words(output))


def translation_s(run_id: str, workdir: Path, data: Path, beam: int, threads: int) -> float:
    """attnseq's own translation time, as OpenNMT-py reports its own: the test sources through ``translate.py``'s
    ``Translator`` in this process, from the model loaded to the last output (start-up and loading left out)."""
    import torch
    from mlflow.tracking import MlflowClient

    from attnseq.evaluation.trained_runs import get_run, load_trained_run
    from attnseq.serving.predictor import DecodeLimit, Translator
    from attnseq.tracking.client import TrackingClient
    from attnseq.tracking.logged_model import logging_scope

    uri = f"sqlite:///{workdir}/mlflow.db"
    client = TrackingClient(uri)
    with logging_scope(MlflowClient(uri)):  # no download progress bars on the benchmark's log
        trained = load_trained_run(client, get_run(client, run_id))
    translator = Translator(trained.model, trained.src_vocab, trained.tgt_vocab, trained.src_tokenizer,
                            trained.tgt_tokenizer, DecodeLimit.of_config(trained.config))
    sources = (data / "test.src").read_text().splitlines()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        started = time.perf_counter()
        translator.translate(sources, beam)
        return time.perf_counter() - started
    finally:
        torch.set_num_threads(before)


# ---- the measurement and its report


def onmt_label(pair: Pair) -> str:
    return f"{PEER}: {pair.name}"


def measure(sizes: Sizes, threads: int, bin_dir: Path, workdir: Path, log) -> dict[str, Result]:
    """Every model of ``sizes.pairs`` trained and decoded ``sizes.repeats`` times, the two tools alternating."""
    data = workdir / "data"
    tokens_per_batch = export(sizes, data)
    log(f"{sizes.steps * BATCH:,} training pairs and {sizes.decode_size:,} test sources written to {data}")
    results: dict[str, Result] = {}
    for repeat in range(sizes.repeats):
        for pair in sizes.pairs:
            models: list[Case | None] = [None, *pair.cases]  # None: OpenNMT-py's
            for case in models if repeat % 2 == 0 else models[::-1]:
                label = onmt_label(pair) if case is None else f"attnseq {case.name}"
                folder = workdir / f"repeat-{repeat}" / label.replace(" ", "_").replace("/", "-").replace(":", "")
                result = results.setdefault(label, Result())
                if case is None:
                    rate, model = train_onmt(bin_dir, pair, data, folder, sizes, threads)
                    decode = partial(decode_onmt, bin_dir, model, data, folder, threads=threads)
                else:
                    rate, run_id = train_attnseq(case, folder, sizes, threads, tokens_per_batch)
                    decode = partial(decode_attnseq, run_id, folder, data, threads=threads)
                result.tokens_per_s.append(rate)
                for beam in sizes.beams:
                    result.decodings.setdefault(beam, []).append(decode(beam=beam))
                shown = ", ".join(f"beam {b} {result.decodings[b][-1].wall_s:.1f} s" for b in sizes.beams)
                log(f"repeat {repeat}, {label}: {rate:,.0f} tokens/s; decoding {shown}")
    return results


def welch(a: list[float], b: list[float]) -> str:
    from attnseq.metrics.significance import welch_p

    p = welch_p(a, b)
    return "—" if p is None else f"{p:.3f}"


class TrainingRow(NamedTuple):
    pair: Pair
    case: Case
    theirs: float  # OpenNMT-py's median tokens/s
    ours: float  # attnseq's
    p: str  # Welch's p over the repeats, printed

    @property
    def ratio(self) -> float:
        return self.ours / self.theirs

    @property
    def goal(self) -> float | None:
        """Issue 28's goal for the pair's own case (the one that computes OpenNMT-py's function), if any."""
        return GOALS.get(self.pair.name) if self.case == self.pair.cases[0] else None

    @property
    def verdict(self) -> str:
        goal = self.goal
        return "measured" if goal is None else f"goal ≥ {goal:g}×: {'met' if self.ratio >= goal else 'NOT met'}"


class DecodingRow(NamedTuple):
    pair: Pair
    beam: int
    wall: tuple[float, float]  # median seconds from launch to exit: OpenNMT-py's, attnseq's
    own: tuple[float, float]  # median seconds of the translation alone, the model loaded: OpenNMT-py's, attnseq's
    p: str  # Welch's p of the translations alone
    words: tuple[float, float]  # mean output tokens per source: OpenNMT-py's, attnseq's

    @property
    def speedup(self) -> float:
        """attnseq's translation alone against OpenNMT-py's: OpenNMT-py's seconds over attnseq's."""
        return self.own[0] / self.own[1]

    @property
    def speedup_from_launch(self) -> float:
        return self.wall[0] / self.wall[1]

    @property
    def label(self) -> str:
        return "greedy" if self.beam == 1 else f"beam {self.beam}"


def training_rows(results: dict[str, Result], sizes: Sizes) -> list[TrainingRow]:
    """Each pair's cases against its OpenNMT-py model, medians over the repeats."""
    median = statistics.median
    rows = []
    for pair in sizes.pairs:
        theirs = results[onmt_label(pair)].tokens_per_s
        for case in pair.cases:
            ours = results[f"attnseq {case.name}"].tokens_per_s
            rows.append(TrainingRow(pair, case, median(theirs), median(ours), welch(ours, theirs)))
    return rows


def decoding_rows(results: dict[str, Result], sizes: Sizes) -> list[DecodingRow]:
    """Each pair's decodings by beam size: OpenNMT-py's model against the attnseq case that computes the same
    function, medians over the repeats."""
    median = statistics.median
    rows = []
    for pair in sizes.pairs:
        theirs, ours = results[onmt_label(pair)].decodings, results[f"attnseq {pair.cases[0].name}"].decodings
        for beam in sizes.beams:
            sides = theirs[beam], ours[beam]
            own = [d.own_s for d in sides[0]], [d.own_s for d in sides[1]]
            rows.append(DecodingRow(pair, beam, tuple(median(d.wall_s for d in side) for side in sides),
                                    (median(own[0]), median(own[1])), welch(own[1], own[0]),
                                    tuple(median(d.output_words for d in side) for side in sides)))
    return rows


def render(results: dict[str, Result], sizes: Sizes, threads: int, command: str) -> str:
    lines = [
        f"`{command}`: the copy task (lengths 5-40, 10 symbols), GRU encoder and decoder, embeddings {EMB}, hidden "
        f"{HIDDEN}, batches of {BATCH}, Adam 1e-3, {sizes.steps} training batches, {threads} threads each; "
        f"{sizes.repeats} repeat(s), the two alternating; medians. Training: target tokens per second from step "
        f"{REPORT_EVERY} to {sizes.steps} of each run. Decoding: {sizes.decode_size:,} test sources through each "
        "command line (`onmt_translate`, `translate.py`): the translation alone, the model loaded (OpenNMT-py's "
        "`-report_time`; attnseq's `Translator`, which `translate.py` runs, timed in the benchmark's process), and "
        "from launch to exit; outputs of at most twice the source's length (attnseq) or twice the longest "
        "source's (OpenNMT-py). `benchmarks/opennmt_peer.py` says how each maps to the other.",
        "",
        f"| {PEER} | attnseq | {PEER} tokens/s | attnseq tokens/s | attnseq / {PEER} | Welch p | goal |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for row in training_rows(results, sizes):
        lines.append(f"| {row.pair.name} | `{row.case.name}` | {row.theirs:,.0f} | {row.ours:,.0f} | "
                     f"**{row.ratio:.2f}×** | {row.p} | {'' if row.goal is None else row.verdict} |")
    lines += ["", f"| model | decoding | translation s, {PEER} / attnseq | speed-up | Welch p | launch to exit s, "
              f"{PEER} / attnseq | speed-up | output tokens per source, {PEER} / attnseq |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in decoding_rows(results, sizes):
        lines.append(f"| {row.pair.name} / `{row.pair.cases[0].name}` | {row.label} | {row.own[0]:.1f} / "
                     f"{row.own[1]:.1f} | **{row.speedup:.2f}×** | {row.p} | {row.wall[0]:.1f} / {row.wall[1]:.1f} | "
                     f"{row.speedup_from_launch:.2f}× | {row.words[0]:.1f} / {row.words[1]:.1f} |")
    return "\n".join(lines) + "\n"


def targets(results: dict[str, Result], sizes: Sizes) -> list[str]:
    """The report's target lines: issue 28's goal where the row has one, the others as measured."""
    lines = [f"- training tokens/s, attnseq `{row.case.name}` / {PEER} {row.pair.name}: **{row.ratio:.2f}×** "
             f"({row.verdict})" for row in training_rows(results, sizes)]
    lines += [f"- decoding {sizes.decode_size:,} sources, {row.label}, `{row.pair.cases[0].name}`, {PEER}'s seconds "
              f"over attnseq's: **{row.speedup:.2f}×** the translation alone, {row.speedup_from_launch:.2f}× from "
              "launch to exit (measured)" for row in decoding_rows(results, sizes)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, help=f"trainings and decodings of each model (default {FULL.repeats})")
    parser.add_argument("--steps", type=int, help=f"training batches per run (default {FULL.steps})")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--onmt-bin", help=f"the bin folder of an environment with {ONMT} (default: a venv "
                                           f"under {VENV})")
    parser.add_argument("--quick", action="store_true", help="one pair, a few steps, greedy only")
    parser.add_argument("--workdir", help="keep the data, logs, models and stores here (default: a temporary folder)")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    sizes = Sizes(args.steps or sizes.steps, sizes.decode_size, args.repeats or sizes.repeats, sizes.pairs, sizes.beams)
    if sizes.repeats < 1 or sizes.steps < 2 * REPORT_EVERY or args.threads < 1:
        parser.error(f"--repeats and --threads must be ≥ 1 and --steps ≥ {2 * REPORT_EVERY} (two reports), "
                     f"e.g. --repeats 3 --steps 400 --threads 2")

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    bin_dir = onmt_bin(args.onmt_bin, log)
    command = "python benchmarks/opennmt_peer.py" + (" --quick" if args.quick else "")
    with tempfile.TemporaryDirectory(prefix="opennmt-peer-") as scratch:
        workdir = Path(args.workdir) if args.workdir else Path(scratch)
        results = measure(sizes, args.threads, bin_dir, workdir, log)
    print(f"## {PEER} beside attnseq\n\n{render(results, sizes, args.threads, command)}\n"
          + "\n".join(targets(results, sizes)))


if __name__ == "__main__":
    main()
