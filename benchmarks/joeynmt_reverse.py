"""JoeyNMT's own task, end to end: wall seconds from launch to a dev BLEU target, attnseq against
JoeyNMT 2.3.0 on the same data, the same model, the same validation cadence, one after the other.

    .venv/bin/python benchmarks/joeynmt_reverse.py            # installs JoeyNMT 2.3.0 in a venv of its own first
    .venv/bin/python benchmarks/joeynmt_reverse.py --joeynmt-python /path/to/its/venv/bin/python
    .venv/bin/python benchmarks/joeynmt_reverse.py --quick    # a tiny corpus, one epoch: the tests' run

- **Data**: ``experiment=joey_reverse``'s splits for the seed (50,000 training pairs of 1-25 symbols, dev and
  test 1,000 pairs of 1-30), written as JoeyNMT's plain files ``train|dev|test.src|trg``; attnseq makes the
  same splits itself from the same config, JoeyNMT reads the files (no time of either is spent here).
- **JoeyNMT**: its tutorial's configuration (``docs/source/tutorial.rst``, ``configs/rnn_reverse.yaml``:
  biLSTM-64 encoder, LSTM-64 decoder with input feeding and Luong's general score, embeddings 16, AdamW
  1e-3, batches of 12 sentences × 2 accumulated, clipping at 1, 5 epochs, validated every 1,000 updates
  with greedy BLEU), at a **constant learning rate**: its ``plateau`` scheduler passes ``verbose`` to
  ``ReduceLROnPlateau``, which torch 2.13 no longer accepts (JoeyNMT has no "no scheduler": its
  ``exponential`` one at a factor of 1 keeps the rate); with patience 5 the plateau would not fire before
  the tutorial's best validation anyway, and attnseq's preset runs at the same constant rate. Run as
  ``python -m joeynmt train`` in its own environment (``--joeynmt-python``; by default a venv under
  ``~/.cache/attnseq`` made with ``pip install torch==2.13.0 joeynmt==2.3.0 importlib-metadata``); each
  validation is read off its log as it is printed.
- **attnseq**: ``train.py experiment=joey_reverse`` (its weights drawn as JoeyNMT's: ``model.init=xavier``)
  validated every 2,000 batches (1,000 updates) counted over the whole run, as JoeyNMT counts its updates
  (``+trainer.check_val_every_n_epoch=null``; counted within each epoch, as before 2026-12-06, attnseq's
  validations fell at 1,000, 2,000, 3,084, 4,084 … updates); its validations are read back from its MLflow
  store.
- Time to a target: from just before the launch to the first validation whose dev BLEU (sacreBLEU, 13a,
  on the tokens joined by spaces, in both) reaches it; each run stops at the highest target, at the end of
  its epochs, or at ``--budget``. The two alternate, seed by seed, on ``--threads`` threads each.
- **Decoding** (issue 28, point 3): each seed's two models, as they stood at the validation that reached the
  highest target (JoeyNMT's checkpoint of that validation: the run stops once it is saved; attnseq's run, which
  stops there itself), translate the test split's 1,000 sources through each command line, greedy and beam 5:
  ``python -m joeynmt translate`` (sources on its standard input) and ``translate.py``. The same search on both
  sides: no length penalty (JoeyNMT's ``beam_alpha`` 0, attnseq's ``length_penalty`` 0), at most
  ``DECODE_BATCH`` sources a batch (``translate.py``'s cap: it batches sources of one length; JoeyNMT sorts
  each batch by length and pads). Timed as the translation alone, the model loaded (JoeyNMT's own "Generation
  took" line; attnseq's ``Translator`` in this process, as ``opennmt_peer.py`` times it) and from launch to
  exit; each output's test BLEU (sacreBLEU, 13a) says the two decoded alike.
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
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from opennmt_peer import TRUSTED_CHECKPOINTS, Decoding, decode_attnseq, mean_words, welch  # noqa: E402
from opennmt_peer import run as run_command  # noqa: E402
from time_to_accuracy import Attempt, Settings, median_reached, run_cli  # noqa: E402  (its siblings, as a script sees them)

from attnseq.serving.predictor import BATCH_SIZE  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
JOEYNMT = "joeynmt==2.3.0"
JOEYNMT_MISSING = "importlib-metadata"  # joeynmt.helpers imports it; its requirements do not name it
TORCH = "torch==2.13.0"  # the CPU wheel on this disk; JoeyNMT's own requirement admits it
VENV = Path.home() / ".cache" / "attnseq" / "joeynmt-2.3.0"
TARGETS = (90.0, 93.0, 95.0)  # dev BLEU; JoeyNMT publishes 95.42 dev, 95.19 test for its tutorial
GOAL = 0.5  # attnseq's seconds to the highest target ÷ JoeyNMT's: at most this (issue 28)
JOEY = "JoeyNMT 2.3.0"
METRIC = "val/sacrebleu"
ACCUMULATION = 2  # JoeyNMT's batch_multiplier = attnseq's trainer.accumulate_grad_batches
SPLITS = {"train": "train", "val": "dev", "test": "test"}  # attnseq's split: JoeyNMT's file stem
BEAMS = (1, 5)  # the decodings of each seed's two models: greedy, beam 5
DECODE_BATCH = BATCH_SIZE  # sources a decoding batch holds at most: translate.py's cap, given to JoeyNMT too


@dataclass(frozen=True)
class Sizes:
    """The task's scale: the preset's, or ``--quick``'s."""

    overrides: tuple[str, ...]  # over experiment=joey_reverse, for both the export and the attnseq run
    epochs: int
    validate_every: int  # optimizer updates between validations
    logging_every: int  # JoeyNMT's logging_freq (its step count is read off these lines)


FULL = Sizes((), epochs=5, validate_every=1000, logging_every=100)
QUICK = Sizes(("dataset.train_size=600", "dataset.val_size=40", "dataset.test_size=40"), epochs=1,
              validate_every=10, logging_every=5)


@dataclass
class Run:
    """One training: each validation as (seconds since launch, updates, dev BLEU); stopped or not."""

    who: str
    seed: int
    validations: list[tuple[float, int, float]] = field(default_factory=list)
    wall_s: float = 0.0
    model: str | None = None  # what decodes: JoeyNMT's checkpoint of its last validation, attnseq's run id
    decodings: dict[int, Decoding] = field(default_factory=dict)  # by beam size
    bleu: dict[int, float] = field(default_factory=dict)  # each decoding's test BLEU, by beam size

    def reached(self, target: float) -> tuple[float, int] | None:
        """(seconds, updates) of the first validation at or above ``target``; None if none was."""
        return next(((s, step) for s, step, bleu in self.validations if bleu >= target), None)

    @property
    def best(self) -> float | None:
        return max((bleu for _, _, bleu in self.validations), default=None)

    @property
    def pace(self) -> float | None:
        """Seconds per 1,000 updates from launch to the last validation; None before any."""
        if not self.validations:
            return None
        seconds, updates, _ = self.validations[-1]
        return 1000 * seconds / updates


# ---- the data


def export(seed: int, sizes: Sizes, folder: Path) -> dict[str, int]:
    """``experiment=joey_reverse``'s splits for ``seed`` as JoeyNMT's plain files in ``folder``; pairs per split."""
    from attnseq.cli import compose_command_line
    from attnseq.config import validate_train
    from attnseq.training.build import build_datamodule

    [cfg] = compose_command_line("train", ["experiment=joey_reverse", *sizes.overrides, f"seed={seed}"])
    datamodule = build_datamodule(validate_train(cfg))
    datamodule.setup()
    folder.mkdir(parents=True, exist_ok=True)
    examples = {"train": datamodule.train_examples, "val": datamodule.val_examples, "test": datamodule.test_examples}
    for split, stem in SPLITS.items():
        for side, suffix in (("src", "src"), ("tgt", "trg")):
            lines = [" ".join(getattr(example, side)) + "\n" for example in examples[split]]
            (folder / f"{stem}.{suffix}").write_text("".join(lines), encoding="utf-8")
    return {split: len(items) for split, items in examples.items()}


# ---- JoeyNMT


def joeynmt_config(data: Path, model_dir: Path, seed: int, sizes: Sizes) -> dict:
    """JoeyNMT 2.3.0's tutorial configuration on ``data``, at a constant learning rate (the module's docstring)."""
    side = {"max_length": 25, "level": "word", "voc_limit": 100, "voc_min_freq": 0}
    embeddings = {"embedding_dim": 16, "scale": False}
    return {
        "name": "reverse_experiment",
        "joeynmt_version": "2.3.0",
        "model_dir": str(model_dir),
        "use_cuda": False,
        "fp16": False,
        "random_seed": seed,
        "data": {
            "train": str(data / "train"), "dev": str(data / "dev"), "test": str(data / "test"),
            "dataset_type": "plain",
            "src": {"lang": "src", **side}, "trg": {"lang": "trg", **side},
            "special_symbols": {"unk_token": "<unk>", "unk_id": 0, "pad_token": "<pad>", "pad_id": 1,
                                "bos_token": "<s>", "bos_id": 2, "eos_token": "</s>", "eos_id": 3},
        },
        "testing": {"n_best": 1, "beam_size": 1, "beam_alpha": 1.0, "eval_metrics": ["bleu"], "min_output_length": 1,
                    "max_output_length": 30, "batch_size": 12, "batch_type": "sentence", "return_prob": "none",
                    "generate_unk": False, "sacrebleu_cfg": {"tokenize": "13a", "lowercase": False}},
        "training": {
            "optimizer": "adamw", "learning_rate": 0.001, "weight_decay": 0.0, "clip_grad_norm": 1.0,
            "batch_size": 12, "batch_type": "sentence", "batch_multiplier": ACCUMULATION,
            "scheduling": "exponential", "decrease_factor": 1.0,  # constant: JoeyNMT has no "none"
            "early_stopping_metric": "bleu", "epochs": sizes.epochs, "validation_freq": sizes.validate_every,
            "logging_freq": sizes.logging_every, "shuffle": True, "print_valid_sents": [0], "keep_best_ckpts": 2,
            "overwrite": True,
        },
        "model": {
            "initializer": "xavier_uniform", "embed_initializer": "normal", "embed_init_weight": 0.1,
            "bias_initializer": "zeros", "init_rnn_orthogonal": False, "lstm_forget_gate": 0.0,
            "encoder": {"type": "recurrent", "rnn_type": "lstm", "embeddings": embeddings, "hidden_size": 64,
                        "bidirectional": True, "dropout": 0.1, "num_layers": 1, "activation": "tanh"},
            "decoder": {"type": "recurrent", "rnn_type": "lstm", "embeddings": embeddings, "hidden_size": 64,
                        "dropout": 0.1, "hidden_dropout": 0.1, "num_layers": 1, "activation": "tanh",
                        "input_feeding": True, "init_hidden": "zero", "attention": "luong"},
        },
    }


STEP_LINE = re.compile(r"Epoch\s+\d+,\s+Step:\s+(\d+),")
VALIDATION_LINE = re.compile(r"Evaluation result \(greedy\).*?\bbleu:\s*([0-9.]+)")
ENDED_LINE = re.compile(r"Training ended|Interrupt at epoch")
CHECKPOINT_LINE = re.compile(r"Checkpoint saved in (.+?)\.?\s*$")
GENERATION_LINE = re.compile(r"Generation took ([0-9.]+)\[sec\]")  # its translation alone, data to outputs


class JoeyLog:
    """JoeyNMT's log, read line by line as it prints it: the update count from its progress lines (every
    ``logging_freq`` updates, so at each validation's own), each validation's BLEU until training ends
    (the dev and test scoring after it are not validations), and the checkpoints it saves (after a
    validation that beats the ones it keeps)."""

    def __init__(self) -> None:
        self.step = 0
        self.training = True
        self.checkpoint: str | None = None  # the last checkpoint saved
        self.saved = False  # whether one was saved since the last validation

    def read(self, line: str, seconds: float) -> tuple[float, int, float] | None:
        """The validation this line reports, as (seconds, updates, BLEU); None for any other line."""
        if ENDED_LINE.search(line):
            self.training = False
        elif found := STEP_LINE.search(line):
            self.step = int(found.group(1))
        elif found := CHECKPOINT_LINE.search(line):
            self.checkpoint, self.saved = found.group(1), True
        elif self.training and (found := VALIDATION_LINE.search(line)):
            self.saved = False
            return seconds, self.step, float(found.group(1))
        return None

    def settled(self, step_at_validation: int) -> bool:
        """Whether what follows a validation is over: its checkpoint saved, or training gone on (or ended)
        without one."""
        return self.saved or self.step > step_at_validation or not self.training


def joeynmt_python(given: str | None, log) -> Path:
    """The interpreter JoeyNMT runs in: ``given``, or ``VENV``'s, made with pip on first use."""
    if given is not None:
        return Path(given)
    python = VENV / "bin" / "python"
    if not python.exists():
        log(f"installing {JOEYNMT} with {TORCH} into {VENV} (once; about a minute)")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", TORCH, JOEYNMT, JOEYNMT_MISSING],
                       check=True)
    return python


def run_joeynmt(python: Path, data: Path, workdir: Path, seed: int, sizes: Sizes, threads: int, stop_at: float,
                budget_s: float) -> Run:
    """One JoeyNMT training from launch, stopped once the first validation ≥ ``stop_at`` has saved its checkpoint
    (or at its end, or the budget); the run's ``model`` is the last checkpoint saved."""
    workdir.mkdir(parents=True)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(joeynmt_config(data, workdir / "model", seed, sizes), sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ATTNSEQ_", "PYTHON"))}
    env["OMP_NUM_THREADS"] = str(threads)  # torch's intra-op threads, as attnseq's threads=T sets them
    run, reader = Run(JOEY, seed), JoeyLog()
    with open(workdir / "train.log", "w") as log:
        launched = time.time()
        process = subprocess.Popen([str(python), "-m", "joeynmt", "train", str(config)], cwd=workdir, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert process.stdout is not None
        stopped = False
        reached: int | None = None  # the updates of the validation that reached ``stop_at``
        for line in process.stdout:
            seconds = time.time() - launched
            log.write(line)
            if (validation := reader.read(line, seconds)) is not None:
                run.validations.append(validation)
                if validation[2] >= stop_at:
                    reached = validation[1]
            if (reached is not None and reader.settled(reached)) or seconds > budget_s:
                stopped = True
                process.terminate()
                break
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # stopped but not gone: no run may outlive its measurement
            process.kill()
            process.wait()
        run.wall_s = time.time() - launched
    if process.returncode != 0 and not stopped:
        tail = (workdir / "train.log").read_text()[-3000:]
        raise RuntimeError(f"JoeyNMT exited with {process.returncode}:\n{tail}")
    run.model = reader.checkpoint
    return run


def decoding_config(training: dict, checkpoint: str, beam: int) -> dict:
    """JoeyNMT's configuration of a training, set to decode with ``checkpoint``: greedy or beam search without a
    length penalty, ``DECODE_BATCH`` sources a batch."""
    testing = {**training["testing"], "load_model": checkpoint, "beam_size": beam, "beam_alpha": 0.0,
               "batch_size": DECODE_BATCH, "batch_type": "sentence"}
    return {**training, "testing": testing}


def decode_joeynmt(python: Path, checkpoint: str, data: Path, workdir: Path, beam: int, threads: int) -> Decoding:
    """``python -m joeynmt translate`` of the test sources (on its standard input) with the training's checkpoint;
    its outputs on its standard output (its ``-o`` fails in 2.3.0: ``BaseConfig`` has no ``n_best``), its log on
    its standard error."""
    config = workdir / f"translate-beam{beam}.yaml"
    training = yaml.safe_load((workdir / "config.yaml").read_text())
    config.write_text(yaml.safe_dump(decoding_config(training, checkpoint, beam), sort_keys=False))
    output = workdir / f"joeynmt-beam{beam}.txt"
    seconds, text = run_command([str(python), "-m", "joeynmt", "translate", str(config)], output, threads,
                                stdin=data / "test.src", env=TRUSTED_CHECKPOINTS)
    own = GENERATION_LINE.search(text)
    if own is None:
        raise RuntimeError(f"no generation time in JoeyNMT's output:\n{text[-2000:]}")
    return Decoding(seconds, float(own.group(1)), mean_words(output))


def test_bleu(outputs: Path, data: Path) -> float:
    """sacreBLEU (13a) of a decoding's outputs, a line per source, against the test split's targets."""
    import sacrebleu

    references = (data / "test.trg").read_text(encoding="utf-8").splitlines()
    hypotheses = outputs.read_text(encoding="utf-8").splitlines()
    if len(hypotheses) != len(references):
        raise RuntimeError(f"{outputs}: {len(hypotheses)} outputs for {len(references)} test sources")
    return sacrebleu.corpus_bleu(hypotheses, [references], tokenize="13a").score


# ---- attnseq


def attnseq_task(sizes: Sizes) -> tuple[str, ...]:
    return (
        "experiment=joey_reverse",
        *sizes.overrides,
        f"trainer.max_epochs={sizes.epochs}",
        f"trainer.val_check_interval={sizes.validate_every * ACCUMULATION}",
        "+trainer.check_val_every_n_epoch=null",  # those batches counted over the run, as JoeyNMT counts updates
        "training.test_after_fit=false",
    )


def run_attnseq(seed: int, sizes: Sizes, threads: int, stop_at: float, budget_s: float, workdir: Path) -> Run:
    settings = Settings(seeds=[seed], target=stop_at, budget_s=budget_s, threads=threads, task=attnseq_task(sizes),
                        metric=METRIC, textbook=False)
    attempt: Attempt = run_cli(settings, settings.task, seed, workdir, who="attnseq")
    # run_cli's step is Lightning's global step + 1: optimizer updates, as JoeyNMT counts its steps
    return Run("attnseq", seed, list(attempt.validations), attempt.wall_s, model=attempt.run_id)


def decode(run: Run, python: Path, data: Path, workdir: Path, threads: int, beams: tuple[int, ...] = BEAMS) -> None:
    """The run's model translates the test sources through its command line, each of ``beams``: its decodings and
    their test BLEU, in the run. ``workdir``: the run's folder (JoeyNMT's configuration, attnseq's store)."""
    for beam in beams:
        if run.who == JOEY:
            run.decodings[beam] = decode_joeynmt(python, run.model, data, workdir, beam, threads)
            outputs = workdir / f"joeynmt-beam{beam}.txt"
        else:
            run.decodings[beam] = decode_attnseq(run.model, workdir, data, beam, threads)
            outputs = workdir / f"translate-beam{beam}.log"  # translate.py's standard output
        run.bleu[beam] = test_bleu(outputs, data)


# ---- the report


def medians(runs: dict[str, list[Run]], target: float) -> tuple[float | None, float | None]:
    """Median seconds to ``target``: (attnseq, JoeyNMT), a seed that never reached it counting as the slowest
    (``median_reached``); None where that median is not reached."""
    return tuple(median_reached([None if (hit := run.reached(target)) is None else hit[0] for run in runs[who]])
                 for who in ("attnseq", JOEY))


def render(runs: dict[str, list[Run]], targets: tuple[float, ...], command: str, sizes: dict[str, int]) -> str:
    """The table of medians (a seed that never reached the target counting as the slowest) and their ratio,
    with Welch's p of the two sides' seconds where every seed reached it and each side has two or more, and one
    line per run."""
    from attnseq.metrics.significance import welch_p

    ours, theirs = runs["attnseq"], runs[JOEY]
    seeds = ", ".join(str(run.seed) for run in ours)
    lines = [
        f"`{command}`: JoeyNMT's reverse task ({sizes['train']:,} training pairs, dev {sizes['val']:,}), "
        f"seeds {seeds}, the two alternating; seconds from launch to the first validation at each dev BLEU.",
        "",
        "| dev BLEU ≥ | attnseq (s) | JoeyNMT 2.3.0 (s) | attnseq / JoeyNMT | Welch p | updates: attnseq / JoeyNMT |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for target in targets:
        a, j = medians(runs, target)
        ratio = f"**{a / j:.2f}×**" if a is not None and j is not None else "–"
        shown = [f"{v:.0f}" if v is not None else "not reached" for v in (a, j)]
        hits = [[run.reached(target) for run in group] for group in (ours, theirs)]
        updates = " / ".join(",".join("–" if hit is None else f"{hit[1]:,}" for hit in group) for group in hits)
        every = all(hit is not None for group in hits for hit in group) and min(map(len, hits)) > 1
        p = welch_p(*([hit[0] for hit in group] for group in hits)) if every else None
        lines.append(f"| {target:g} | {shown[0]} | {shown[1]} | {ratio} | {'–' if p is None else f'{p:.3f}'} "
                     f"| {updates} |")
    if any(run.reached(target) is None for group in (ours, theirs) for run in group for target in targets):
        lines += ["", "A seed that never reached a dev BLEU counts as the slowest of its side there (the median is "
                      "over all its seeds, `–` where it falls on such a seed); such a row has no test."]
    lines.append("")
    for group in (ours, theirs):
        for run in group:
            best = "none" if run.best is None else f"{run.best:.2f}"
            pace = "" if run.pace is None else f", {run.pace:.0f} s per 1,000 updates"
            lines.append(f"- {run.who}, seed {run.seed}: {len(run.validations)} validations, best dev BLEU {best}, "
                         f"{run.wall_s:.0f} s launch to exit{pace}")
    paces = [[run.pace for run in group if run.pace is not None] for group in (ours, theirs)]
    if all(paces):
        a, j = (statistics.median(p) for p in paces)
        p = welch_p(*paces) if min(map(len, paces)) > 1 else None
        lines += ["", f"Seconds per 1,000 updates (launch to the last validation, start-up and validations included), "
                      f"medians: attnseq {a:.0f}, JoeyNMT {j:.0f}: **{a / j:.2f}×**"
                      + ("" if p is None else f" (Welch p = {p:.3f})")
                      + ". Updates to a target vary between seeds and runs for both; this does not."]
    if rows := decoding_rows(runs):
        lines += ["", f"Decoding the test split ({sizes['test']:,} sources) with each seed's two models as they "
                      "stood at their last validation, through each command line (`python -m joeynmt translate`, "
                      f"`translate.py`), at most {DECODE_BATCH} sources a batch, no length penalty; medians over the "
                      "seeds. The translation alone: the model loaded (JoeyNMT's \"Generation took\"; attnseq's "
                      "`Translator`, timed in the benchmark's process); speed-up: JoeyNMT's seconds over attnseq's.",
                  "",
                  f"| decoding | translation s, {JOEY} / attnseq | speed-up | Welch p | launch to exit s, {JOEY} / "
                  f"attnseq | speed-up | test BLEU, {JOEY} / attnseq | output tokens per source, {JOEY} / attnseq |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for row in rows:
            lines.append(f"| {row.label} | {row.own[0]:.2f} / {row.own[1]:.2f} | **{row.speedup:.2f}×** | {row.p} | "
                         f"{row.wall[0]:.1f} / {row.wall[1]:.1f} | {row.speedup_from_launch:.2f}× | "
                         f"{row.bleu[0]:.2f} / {row.bleu[1]:.2f} | {row.words[0]:.1f} / {row.words[1]:.1f} |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class DecodingRow:
    """One beam size's decodings over the seeds where both sides decoded: medians, (JoeyNMT's, attnseq's)."""

    beam: int
    own: tuple[float, float]  # the translation alone, seconds
    wall: tuple[float, float]  # launch to exit, seconds
    bleu: tuple[float, float]  # test BLEU
    words: tuple[float, float]  # output tokens per source
    p: str  # Welch's p of the translations alone

    @property
    def speedup(self) -> float:
        """JoeyNMT's seconds of translation over attnseq's."""
        return self.own[0] / self.own[1]

    @property
    def speedup_from_launch(self) -> float:
        """JoeyNMT's seconds from launch to exit over attnseq's."""
        return self.wall[0] / self.wall[1]

    @property
    def label(self) -> str:
        return "greedy" if self.beam == 1 else f"beam {self.beam}"


def decoding_rows(runs: dict[str, list[Run]]) -> list[DecodingRow]:
    """A row per beam size that both sides decoded with, over the seeds where both did."""
    median = statistics.median
    rows = []
    for beam in BEAMS:
        pairs = [(j, a) for a, j in zip(runs["attnseq"], runs[JOEY], strict=True)
                 if beam in a.decodings and beam in j.decodings]
        if not pairs:
            continue
        sides = [[run.decodings[beam] for run in side] for side in zip(*pairs, strict=True)]  # JoeyNMT's, attnseq's
        own = [[d.own_s for d in side] for side in sides]
        rows.append(DecodingRow(
            beam, (median(own[0]), median(own[1])), tuple(median(d.wall_s for d in side) for side in sides),
            tuple(median(run.bleu[beam] for run in side) for side in zip(*pairs, strict=True)),
            tuple(median(d.output_words for d in side) for side in sides), welch(own[1], own[0])))
    return rows


def measure(seeds: list[int], sizes: Sizes, threads: int, budget_s: float, python: Path, workdir: Path,
            targets: tuple[float, ...], log) -> tuple[dict[str, list[Run]], dict[str, int]]:
    runs: dict[str, list[Run]] = {"attnseq": [], JOEY: []}
    counts: dict[str, int] = {}
    stop_at = max(targets)
    for seed in seeds:
        data = workdir / f"data-{seed}"
        counts = export(seed, sizes, data)
        log(f"seed {seed}: {counts['train']:,} training pairs written to {data}")
        ours = run_attnseq(seed, sizes, threads, stop_at, budget_s, workdir / f"attnseq-{seed}")
        log(f"  attnseq: {ours.validations[-1] if ours.validations else 'no validation'} after {ours.wall_s:.0f} s")
        theirs = run_joeynmt(python, data, workdir / f"joeynmt-{seed}", seed, sizes, threads, stop_at, budget_s)
        log(f"  JoeyNMT: {theirs.validations[-1] if theirs.validations else 'no validation'} after "
            f"{theirs.wall_s:.0f} s")
        for run, folder in ((ours, f"attnseq-{seed}"), (theirs, f"joeynmt-{seed}")):
            if run.model is None:
                log(f"  {run.who}: no model saved, nothing to decode")
                continue
            decode(run, python, data, workdir / folder, threads)
            log(f"  {run.who} decoding {len(run.decodings)} ways: " + ", ".join(
                f"beam {beam} {d.own_s:.2f} s ({d.wall_s:.1f} s from launch), test BLEU {run.bleu[beam]:.2f}"
                for beam, d in run.decodings.items()))
        runs["attnseq"].append(ours)
        runs[JOEY].append(theirs)
    return runs, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1, each trained by both (~4 min a seed)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget", type=float, default=1500.0, help="seconds per training before it is stopped")
    parser.add_argument("--joeynmt-python", help=f"an interpreter with {JOEYNMT} (default: a venv under {VENV})")
    parser.add_argument("--quick", action="store_true", help="a tiny corpus, one epoch, validated every 10 updates")
    parser.add_argument("--workdir", help="keep the data, logs and stores here (default: a temporary folder)")
    args = parser.parse_args()
    if args.seeds < 1 or args.threads < 1 or args.budget <= 0:
        parser.error("--seeds and --threads must be ≥ 1 and --budget > 0, e.g. --seeds 1 --threads 2 --budget 1500")
    sizes = QUICK if args.quick else FULL
    targets = (0.0,) if args.quick else TARGETS  # the quick corpus learns next to nothing: any BLEU counts

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    python = joeynmt_python(args.joeynmt_python, log)
    command = "python benchmarks/joeynmt_reverse.py" + (" --quick" if args.quick else "") + f" --seeds {args.seeds}"
    with tempfile.TemporaryDirectory(prefix="joeynmt-reverse-") as scratch:
        workdir = Path(args.workdir) if args.workdir else Path(scratch)
        runs, counts = measure(list(range(args.seeds)), sizes, args.threads, args.budget, python, workdir, targets, log)
    print(render(runs, targets, command, counts))


if __name__ == "__main__":
    main()
