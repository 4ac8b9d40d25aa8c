"""Training and decoding throughput of attnseq, side by side in one process.

    .venv/bin/python benchmarks/bench.py              # the full run → benchmarks/results.md
    .venv/bin/python benchmarks/bench.py --quick      # a few small cases, a few steps: what the tests run
    .venv/bin/python benchmarks/bench.py --compile    # adds torch.compile rows (each compile is timed)
    .venv/bin/python benchmarks/bench.py --sections none   # the training tables only (≈ 20 min)
    .venv/bin/python benchmarks/bench.py --cases slow --sections none   # the target cases and the slow families

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
- The **baseline** is a textbook Bahdanau model (``loops.TextbookBahdanau``): U_a h_i recomputed
  at every step, ``nn.GRU`` stepped once per token, ``torch.cat`` per step; same sizes, packed
  encoder. ``×base`` is a loop's ratio to the baseline measured in the same run, at the same batching.
- **activation memory**: bytes saved for backward by one training step on the longest batch
  (distinct storages; on CUDA the allocator's peak over the step), and the process's peak RSS.
- **padding**: the fraction of source and target positions that are padding over one epoch,
  with and without length bucketing; throughput on random batches for the key cases.
- **decoding**: batched greedy decoding vs one sequence at a time, and batched beam search.
- **the Transformer beside nn.Transformer** (every run, ``transformer_reference.py``): attnseq's
  encoder=transformer decoder=transformer and a plain ``nn.Transformer`` model with the same sizes
  and initial weights, trained in lock step on the same batches (with the real path and the
  baseline), then decoded: attnseq's greedy and beam 5 with the key/value cache, the reference's
  greedy recomputing the prefix at every step, and the decoding section's RNN decoder beside.
- **the slow families without their fast paths**: every case of ``cases.SLOW_FAMILIES`` (the LSTM cases;
  biGRU + Luong + additive/concat) runs one more minimal loop in its lock step, the same model with every fast
  path off (``cases.NO_FAST_PATHS``), so the report says what each case short of the goal would need.
- **what was tried** (full run, ``cases.VARIANTS``): a fast path turned off or on (``FastPaths``:
  the step-by-step decoder loop, ``torch.gru``'s and ``nn.LSTM``'s autograd backward, the all-steps
  additive kernel), config overrides (Adam ``fused=True``, the progress bar off, a DataLoader
  worker), and (``--compile``) torch.compile.
- **what users wait on** (full run, ``waits.SECTIONS``, each its own module): time to accuracy
  through the CLI beside the textbook, where a run's time goes, JoeyNMT's reverse task beside JoeyNMT
  2.3.0, start-up, evaluation throughput, a remote tracking server.

The parts: ``cases.py`` (what is trained), ``loops.py`` (what is timed), ``waits.py`` (the sections
after the training tables), ``report.py`` (the Markdown); this file runs them in order. The new
report keeps the previous one's real-path ratios beside its own.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from cases import (
    KEY_ADDITIVE,
    KEY_DOT,
    KEY_GENERAL,
    REPO,
    TRANSFORMER,
    Case,
    Settings,
    Variant,
    all_cases,
    benchmark_config,
    in_slow_family,
    quick_cases,
    transformer_config,
)
from loops import BASELINE, Loop, TextbookBahdanau, activation_bytes, decoding, real_path, step_together, window_rates
from machine import machine_line
from report import Results, fmt, fmt_ratio, previous_ratios, render
from torch import nn
from transformer_reference import REFERENCE, copy_from, parameters_by_design, textbook_transformer
from transformer_reference import decoding as transformer_decoding
from waits import SECTIONS, run_sections

from attnseq.config import validate_train
from attnseq.data.sampler import padding_fraction
from attnseq.kernels import DEFAULT_FAST_PATHS, FastPaths
from attnseq.model import build_seq2seq
from attnseq.training.build import build_datamodule, build_module, model_config
from attnseq.training.process import keep_freed_memory


def setup_datamodule(cfg):
    datamodule = build_datamodule(validate_train(cfg))
    datamodule.setup()
    return datamodule


class Bench:
    """One benchmark run: the data every loop shares, the cases' configs, and the results being
    filled in. Each ``measure_*`` method adds its rows to ``results``."""

    def __init__(self, settings: Settings, workdir: Path, log: Callable[[str], None]) -> None:
        self.settings = settings
        self.workdir = workdir
        self.log = log
        self.results = Results(settings, allocator_keeps_freed_memory=keep_freed_memory())  # as train() does
        self.cfgs = {case: benchmark_config(case, settings, workdir) for case in settings.cases}
        first = settings.cases[0]
        self.datamodule = setup_datamodule(self.cfgs[first])
        self.random_datamodule = setup_datamodule(benchmark_config(first, settings, workdir, bucketing=False))
        epochs = {
            "bucketed": list(self.datamodule.train_dataloader()),
            "random": list(self.random_datamodule.train_dataloader()),
        }
        if len(epochs["bucketed"]) < settings.steps:
            raise ValueError(f"{len(epochs['bucketed'])} batches per epoch < {settings.steps} steps: raise train_size")
        self.tokens = {kind: [int(b.tgt_lengths.sum()) for b in batches] for kind, batches in epochs.items()}
        self.results.padding = {
            kind: 1.0
            - sum(int(b.src_lengths.sum()) + int(b.tgt_lengths.sum()) for b in batches)
            / sum(b.src.numel() + b.tgt_out.numel() for b in batches)
            for kind, batches in epochs.items()
        }
        self.results.padding_worst_batch = max(padding_fraction(b) for b in epochs["bucketed"])
        self.longest = max(epochs["bucketed"], key=lambda b: b.tgt_in.numel())
        self.vocab = (len(self.datamodule.src_vocab), len(self.datamodule.tgt_vocab))
        self.decode_model: nn.Module | None = None  # the decoding section's trained model

    # ---- what the loops train

    def model(self, case: Case, fast_paths: FastPaths = DEFAULT_FAST_PATHS) -> nn.Module:
        torch.manual_seed(0)
        return build_seq2seq(model_config(validate_train(self.cfgs[case]), *self.vocab), fast_paths)

    def textbook(self) -> nn.Module:
        torch.manual_seed(0)
        return TextbookBahdanau(*self.vocab, *self.settings.sizes)

    def loop(self, model: nn.Module, cfg, datamodule=None) -> Loop:
        loader = (datamodule or self.datamodule).train_dataloader()
        return Loop(model, loader, cfg, self.settings.device)

    def case_loops(self, case: Case) -> dict[str, Loop]:
        """The case's minimal loop and the baseline, which every trainer run holds in lock step."""
        return {
            "minimal": self.loop(self.model(case), self.cfgs[case]),
            BASELINE: self.loop(self.textbook(), self.cfgs[case]),
        }

    def variant_config(self, variant: Variant):
        return benchmark_config(variant.case, self.settings, self.workdir, extra=variant.overrides)

    # ---- measuring

    def rates(self, durations: list[float], kind: str = "bucketed") -> list[float]:
        """Tokens per second over each timed window of a loop's step ``durations``."""
        s = self.settings
        return window_rates(durations, self.tokens[kind], s.warmup, s.window, s.windows)

    def record(self, label: str, loop: str, durations: list[float], kind: str = "bucketed") -> None:
        self.results.row(label).rates.setdefault(loop, []).extend(self.rates(durations, kind))

    def measure(
        self, label: str, cfg, loops: dict[str, Loop], datamodule=None, fast_paths: FastPaths = DEFAULT_FAST_PATHS
    ) -> None:
        """One trainer run with ``loops`` in lock step: the row ``label`` gets the real path and
        the loop ``minimal``, every other loop its own row, all with this run's baseline."""
        began = time.perf_counter()
        datamodule = datamodule or self.datamodule
        module = build_module(validate_train(cfg), datamodule, fast_paths=fast_paths)
        self.record(label, "real", real_path(module, cfg, datamodule, loops, self.settings.steps, self.settings.device))
        baseline = loops[BASELINE].durations
        self.record(BASELINE, "minimal", baseline)
        for name, loop in loops.items():
            if name != BASELINE:
                row = label if name == "minimal" else name
                self.record(row, "minimal", loop.durations)
                self.record(row, BASELINE, baseline)
        row = self.results.rows[label]
        self.log(
            f"{label:45s} real {fmt(row.median('real')):>7s}  minimal {fmt(row.median('minimal')):>7s}  "
            f"{BASELINE} {fmt(row.median(BASELINE)):>7s} tok/s  ({time.perf_counter() - began:.0f} s)"
        )

    def measure_case(self, case: Case, variants: list[Variant]) -> None:
        """The case's trainer run, with one more minimal loop per variant that varies the minimal loop."""
        loops = self.case_loops(case)
        for variant in variants:
            loops[variant.label] = self.loop(self.model(case, variant.fast_paths), self.variant_config(variant))
        self.measure(case.name, self.cfgs[case], loops)
        for variant in variants:
            self.results.rows[variant.label].kept = case.name
        self.results.rows[case.name].activations = activation_bytes(
            self.model(case), self.longest, self.settings.device
        )

    def measure_real_variant(self, variant: Variant) -> None:
        """A trainer run of its own for a variant of the real path; the loops are the case's."""
        cfg, case_cfg = self.variant_config(variant), self.cfgs[variant.case]
        datamodule = self.datamodule if cfg.dataset == case_cfg.dataset else setup_datamodule(cfg)
        self.measure(variant.label, cfg, self.case_loops(variant.case), datamodule, variant.fast_paths)
        row = self.results.rows[variant.label]
        row.kept, row.varies = variant.case.name, "real"

    def measure_random_batches(self, cases: list[Case]) -> None:
        """The baseline and ``cases`` on unbucketed batches, in lock step without a trainer."""
        first = self.cfgs[self.settings.cases[0]]
        loops = {BASELINE: self.loop(self.textbook(), first, self.random_datamodule)}
        loops.update({c.name: self.loop(self.model(c), self.cfgs[c], self.random_datamodule) for c in cases})
        step_together(list(loops.values()), self.settings.steps - 1)
        for name, loop in loops.items():
            self.record(name, "random", loop.durations, kind="random")

    def measure_compiled(self, case: Case) -> None:
        """torch.compile (dynamic shapes) of the whole model in the minimal loop, in lock step with
        the uncompiled one and the baseline; the compile time is the first step's."""
        cfg = self.cfgs[case]
        loops = {
            "compiled": self.loop(torch.compile(self.model(case), dynamic=True), cfg),
            "plain": self.loop(self.model(case), cfg),
            "base": self.loop(self.textbook(), cfg),
        }
        step_together(list(loops.values()), self.settings.steps - 1)
        rates = {name: statistics.median(self.rates(loop.durations)) for name, loop in loops.items()}
        compile_s = loops["compiled"].durations[0]
        self.results.compiled[case.name] = {"compile_s": compile_s, **rates}
        self.log(f"{case.name} torch.compile: first step {compile_s:.0f} s, {rates}")

    def measure_decoding(self, case: Case) -> None:
        """Decoding with the case's model after a little training, so outputs end with EOS as in evaluation."""
        trained = self.loop(self.model(case), self.cfgs[case])
        step_together([trained], min(self.settings.steps, 40))
        examples = self.datamodule.train_examples[: 64 * self.settings.decode_batches]
        self.results.decoding = decoding(
            trained.model, examples, self.datamodule, self.cfgs[case], self.settings.device, self.log
        )
        self.results.decode_case = case.name
        self.decode_model = trained.model

    def measure_transformer(self) -> None:
        """attnseq's encoder–decoder Transformer (``cases.TRANSFORMER``) beside ``nn.Transformer`` with
        its initial weights, trained in lock step on the same batches (the real path and the baseline
        too), then decoded: attnseq greedy and beam with the key/value cache, the reference greedy the
        textbook way, with the trained weights copied into it; the RNN decoder of the decoding section beside."""
        s = self.settings
        cfg = transformer_config(s, self.workdir)
        config = model_config(validate_train(cfg), *self.vocab)

        def attnseq_model() -> nn.Module:
            torch.manual_seed(0)
            return build_seq2seq(config)

        ours, reference = attnseq_model(), textbook_transformer(attnseq_model(), *self.vocab, config.dropout)
        loops = {"minimal": self.loop(ours, cfg), REFERENCE: self.loop(reference, cfg),
                 BASELINE: self.loop(self.textbook(), cfg)}
        label = f"{TRANSFORMER.name}, model.heads={cfg.model.heads}"
        self.measure(label, cfg, loops)
        if loops["minimal"].tokens != loops[REFERENCE].tokens:
            raise RuntimeError("attnseq's Transformer and nn.Transformer were not trained on the same batches")
        for row, model in ((label, ours), (REFERENCE, reference)):
            self.results.rows[row].activations = activation_bytes(model, self.longest, s.device)
        copy_from(reference, ours)  # decode with the trained weights, the same function both ways
        examples = self.datamodule.train_examples[: 64 * s.decode_batches]
        batches = [b.to(s.device) for b in self.datamodule.make_dataloader(examples, 64)]
        decoded = transformer_decoding(ours, reference, self.decode_model, self.results.decode_case, batches, cfg,
                                       s.device, s.decode_repeats)
        self.results.transformer = {
            "label": label,
            "config": {key: cfg.decoder[key] for key in ("layers", "heads", "ff_dim")} | {"dropout": config.dropout},
            "steps": len(loops["minimal"].tokens),
            "tokens": sum(loops["minimal"].tokens),
            "same_tokens": loops["minimal"].tokens == loops[REFERENCE].tokens,
            "losses": [[float(loops[name].losses[i]) for name in ("minimal", REFERENCE)] for i in (0, -1)],
            "parameters": parameters_by_design(ours, reference),
            "decoding": decoded,
        }
        ratio = self.results.transformer_ratio("minimal")
        self.log(f"transformer vs {REFERENCE}: training {fmt_ratio(ratio)}, decoding {decoded}")


def run(settings: Settings, log: Callable[[str], None] = print, workdir: Path | None = None) -> Results:
    """Every measurement; ``report.render`` turns the result into Markdown. The MLflow store and
    the trainer's outputs go to ``workdir`` (default: a temporary folder, removed afterwards)."""
    torch.set_num_threads(settings.threads)
    warnings.filterwarnings("ignore")  # Lightning's advice on workers and logging intervals
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)
    started = time.time()
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="attnseq-bench-")))
        bench = Bench(settings, workdir, log)
        variants = settings.variants()
        for case in settings.cases:
            bench.measure_case(case, [v for v in variants if v.case == case and v.loop == "minimal"])
        for variant in variants:
            if variant.loop == "real":
                bench.measure_real_variant(variant)
        key_cases = [case for case in (KEY_ADDITIVE, KEY_DOT) if case in bench.cfgs]
        bench.measure_random_batches(key_cases)
        bench.results.rows[BASELINE].activations = activation_bytes(bench.textbook(), bench.longest, settings.device)
        if settings.compile:
            for case in key_cases:
                bench.measure_compiled(case)
        bench.measure_decoding(KEY_ADDITIVE if KEY_ADDITIVE in bench.cfgs else settings.cases[0])
        bench.measure_transformer()
    results = bench.results
    results.waits = run_sections(list(settings.sections), settings.threads, log)
    results.machine = machine_line(settings.device)
    results.max_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results.minutes = (time.time() - started) / 60
    return results


def make_settings(args: argparse.Namespace) -> Settings:
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    threads = args.threads or torch.get_num_threads()
    if args.quick:
        return Settings(
            warmup=1,
            window=2,
            windows=2,
            train_size=64 * 8,
            decode_batches=1,
            decode_repeats=1,
            cases=quick_cases(),
            threads=threads,
            device=device,
            sizes=(16, 32),
            compile=args.compile,
            ablations=False,
        )
    key = quick_cases()
    key += [KEY_GENERAL] if KEY_GENERAL not in key else []
    slow = [KEY_ADDITIVE, KEY_DOT, KEY_GENERAL, *(case for case in all_cases() if in_slow_family(case))]
    chosen = args.case or {
        "all": all_cases, "key": lambda: key, "slow": lambda: slow, "transformer": lambda: [KEY_ADDITIVE]
    }[args.cases]()
    return Settings(
        warmup=args.warmup,
        window=args.window,
        windows=args.windows,
        train_size=64 * (args.warmup + args.window * args.windows + 2),
        decode_batches=4,
        cases=chosen,
        threads=threads,
        device=device,
        compile=args.compile,
        sections=tuple(args.sections),
        ablations=args.cases != "transformer",  # what was tried: for the full matrix and the key cases
    )


def case_named(text: str) -> Case:
    """``--case``: ``encoder/scorer/decoder``, a case of the full matrix (``all_cases``)."""
    known = {case.name: case for case in all_cases()}
    if text not in known:
        raise argparse.ArgumentTypeError(f"{text!r} is not a case of the matrix: encoder/scorer/decoder, e.g. "
                                         f"gru/dot/bahdanau (one of {len(known)}: {', '.join(list(known)[:4])}, …)")
    return known[text]


def section_names(text: str) -> list[str]:
    """``--sections``: "all", "none" or names from ``waits.SECTIONS``, comma-separated."""
    if text in ("all", "none"):
        return list(SECTIONS) if text == "all" else []
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in SECTIONS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown section(s) {', '.join(unknown)}: use 'all', 'none' or "
                                         f"a comma-separated list of {', '.join(SECTIONS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a few small cases, a few steps (what the tests run)")
    parser.add_argument(
        "--cases",
        choices=("all", "key", "slow", "transformer"),
        default="all",
        help="the full matrix, the quick cases and gru/general/luong-nofeed, the three target cases and the slow "
        "families (LSTM; biGRU + Luong + additive/concat) with their fast paths off beside, or only "
        "gru/additive/bahdanau (with --sections none: the Transformer beside nn.Transformer, which every run "
        "measures, in minutes)",
    )
    parser.add_argument("--case", type=case_named, action="append", default=[], metavar="ENCODER/SCORER/DECODER",
                        help="only these cases (repeatable), with what was tried on them; instead of --cases")
    parser.add_argument("--warmup", type=int, default=5, help="steps before the first timed window")
    parser.add_argument("--window", type=int, default=25, help="steps per timed window, and the logging interval")
    parser.add_argument("--windows", type=int, default=3, help="timed windows per run")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (bf16 autocast on CUDA)")
    parser.add_argument("--compile", action="store_true", help="add torch.compile rows (each compile is timed)")
    parser.add_argument(
        "--sections",
        type=section_names,
        default=list(SECTIONS),
        help=f"what users wait on, after the training tables: all (default), none, or some of {', '.join(SECTIONS)}"
        " (--quick runs none)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the Markdown file (default: benchmarks/results.md; none with --quick)"
    )
    parser.add_argument(
        "--compare", type=Path, default=None,
        help="the report whose real-path ratios stand beside this run's as `×base at <commit>` (default: --out's "
        "file where it exists, else benchmarks/results.md; none with --quick)",
    )
    args = parser.parse_args(argv)
    settings = make_settings(args)
    results = run(settings, log=lambda line: print(line, file=sys.stderr, flush=True))
    shown_args = " ".join(argv if argv is not None else sys.argv[1:])
    out = args.out or (None if args.quick else REPO / "benchmarks" / "results.md")
    earlier = args.compare or (None if args.quick else next(
        (path for path in (out, REPO / "benchmarks" / "results.md") if path is not None and path.exists()), None))
    previous = previous_ratios(earlier.read_text()) if earlier is not None else None
    report = render(results, f"python benchmarks/bench.py {shown_args}".strip(), previous)
    print(report)
    if out is not None:
        out.write_text(report)
        print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
