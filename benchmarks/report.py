"""What the benchmark reports: its results, and their Markdown (benchmarks/results.md) with the
targets checked."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

from cases import (
    KEY_ADDITIVE,
    KEY_DOT,
    KEY_GENERAL,
    SLOW_FAMILIES,
    SLOW_FAMILIES_GOAL,
    WITHOUT_FAST_PATHS,
    Case,
    Settings,
    in_slow_family,
    without_fast_paths,
)
from loops import BASELINE
from machine import git_state
from transformer_reference import REFERENCE
from waits import Waited


@dataclass
class Row:
    """One line of the tables: a case, a variant or the baseline, with its loops' window rates."""

    label: str
    rates: dict[str, list[float]] = field(default_factory=dict)  # loop → window throughputs
    activations: int | None = None
    kept: str | None = None  # for a variant: the label of the case it varies
    varies: str = "minimal"  # for a variant: the loop that differs from the kept case

    def median(self, loop: str) -> float | None:
        values = self.rates.get(loop)
        return statistics.median(values) if values else None

    def ratio(self, loop: str, other: str = BASELINE) -> float | None:
        a, b = self.median(loop), self.median(other)
        return None if a is None or not b else a / b


@dataclass
class Results:
    settings: Settings
    allocator_keeps_freed_memory: bool
    rows: dict[str, Row] = field(default_factory=dict)
    padding: dict[str, float] = field(default_factory=dict)  # bucketed | random → padding fraction
    padding_worst_batch: float = 0.0
    decoding: dict[str, dict[str, float]] = field(default_factory=dict)  # name → seq_s, tok_s
    decode_case: str = ""
    compiled: dict[str, dict[str, float]] = field(default_factory=dict)  # case → compile_s, compiled, plain, base
    waits: dict[str, Waited] = field(default_factory=dict)  # waits.SECTIONS name → its Markdown and targets
    transformer: dict = field(default_factory=dict)  # bench.measure_transformer: the Transformer beside nn.Transformer
    machine: str = ""
    max_rss_mib: float = 0.0
    minutes: float = 0.0

    def row(self, label: str) -> Row:
        return self.rows.setdefault(label, Row(label))

    def transformer_ratio(self, loop: str) -> float | None:
        """attnseq's Transformer (its ``loop``: real or minimal) over ``nn.Transformer``'s tokens/s: the
        median over the timed windows of each window's ratio (both measured in the same steps)."""
        if not self.transformer:
            return None
        ours, theirs = self.rows[self.transformer["label"]].rates.get(loop), self.rows[REFERENCE].rates.get("minimal")
        ratios = [a / b for a, b in zip(ours or [], theirs or [], strict=False) if b]
        return statistics.median(ratios) if ratios else None


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def fmt_percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * (value - 1):+.1f}%"


def cells(*values: str) -> str:
    """One row of a Markdown table."""
    return "| " + " | ".join(values) + " |"


def fmt_mib(row: Row) -> str:
    return "—" if row.activations is None else f"{row.activations / 2**20:.1f}"


@dataclass
class Previous:
    """The real path's ×base per row of an earlier report, and the commit it names."""

    commit: str
    ratios: dict[str, str]  # row label → its "real path ×base" cell, as written
    processor: str = ""  # the processor its machine line names; "" if it names none


def processor_of(machine: str) -> str:
    """The processor in a machine line ("2 cores (AMD EPYC), device cpu, ..." → "AMD EPYC"), or ""."""
    match = re.match(r"\d+ cores \((.*?)\)(?:, GPU [^,]*)?, device ", machine)
    return match.group(1) if match else ""


def header_field(markdown: str, name: str) -> str:
    prefix = f"- {name}:"
    return next((line[len(prefix) :].strip() for line in markdown.splitlines() if line.startswith(prefix)), "")


def previous_ratios(markdown: str) -> Previous | None:
    """Read back an earlier ``render``'s training table; None if it holds none."""
    commit = header_field(markdown, "commit")
    table = markdown.split("## Training throughput", 1)
    if len(table) < 2:
        return None
    ratios = {}
    for line in table[1].split("\n## ", 1)[0].splitlines():
        parts = [part.strip() for part in line.strip().strip("|").split("|")]
        if len(parts) >= 3 and parts[2].endswith("×"):
            ratios[parts[0]] = parts[2]
    if not ratios:
        return None
    processor = processor_of(header_field(markdown, "machine"))
    return Previous(commit.split()[0][:7] if commit else "unknown", ratios, processor)


def previous_note(previous: Previous, machine: str) -> str:
    """The footnote under the ``×base at <commit>`` column; it warns when the processors differ."""
    note = f"`×base at {previous.commit}`: the real path's ratio in the report this one replaced"
    processor = processor_of(machine)
    if previous.processor and processor and previous.processor != processor:
        return (
            f"{note}, measured on another processor ({previous.processor}; this run: {processor}). The textbook "
            "baseline's speed differs between processors, so a ratio that moved between the two reports may "
            "have moved with the machine, not the code."
        )
    return note + "."


def render(results: Results, command: str, previous: Previous | None = None) -> str:
    lines = [
        *header(results, command),
        *training_table(results, previous),
        *padding_table(results),
        *tried_table(results),
        *short_of_goal_table(results),
        *decoding_table(results),
        *transformer_tables(results),
    ]
    for section in results.waits.values():
        lines += ["", section.markdown.rstrip("\n")]
    lines += ["", "## Targets", "", *targets(results)]
    wait_targets = [line for section in results.waits.values() for line in section.targets]
    if wait_targets:
        lines += ["", "What users wait on:", "", *wait_targets]
    return "\n".join(lines) + "\n"


def header(results: Results, command: str) -> list[str]:
    settings = results.settings
    emb, hidden = settings.sizes
    return [
        "# attnseq benchmark: training and decoding throughput, and what users wait on",
        "",
        f"- command: `{command}`",
        f"- commit: {git_state()}",
        f"- machine: {results.machine}; peak RSS {results.max_rss_mib:.0f} MiB; {results.minutes:.1f} min in all",
        f"- allocator: glibc keeps freed memory for reuse (`attnseq.training.process.keep_freed_memory`, as train() "
        f"does): {'yes' if results.allocator_keeps_freed_memory else 'no (not glibc)'}",
        f"- task: copy, source lengths 5–40, batch 64, emb {emb} / hidden {hidden}, Adam (lr from the config) + "
        f"gradient clipping 1.0; {settings.windows} windows of {settings.window} steps after {settings.warmup} "
        "warm-up steps; medians over windows",
        "- `real path`: Seq2SeqLitModule + lightning.Trainer (conf/trainer/cpu.yaml, logging every "
        f"{settings.window} steps, Lightning's default progress bar as in train()) + MLFlowLogger on SQLite; "
        "`minimal`: a bare loop over the same model and batches; both in lock step with the "
        f"`{BASELINE}` baseline (Bahdanau additive as textbooks write it: U_a h_i re-projected every step, "
        "nn.GRU stepped per token); `×base` is the ratio to that baseline in the same run; "
        "`overhead` = minimal / real − 1",
    ]


def training_table(results: Results, previous: Previous | None = None) -> list[str]:
    rows = results.rows
    base_row = rows[BASELINE]
    earlier = [] if previous is None else [f"×base at {previous.commit}"]
    lines = [
        "",
        "## Training throughput (target tokens/s, length-bucketed batches)",
        "",
        cells("encoder / scorer / decoder", "real path", "×base", *earlier, "minimal loop", "×base", "overhead",
              "activations MiB"),
        "|---|" + "---:|" * (6 + len(earlier)),
        cells(f"{BASELINE} (all runs pooled)", "—", "—", *["—"] * len(earlier), fmt(base_row.median("minimal")),
              "1.00×", "—", fmt_mib(base_row)),
    ]
    for case in results.settings.cases:
        row = rows[case.name]
        real, minimal = row.median("real"), row.median("minimal")
        overhead = row.ratio("minimal", "real")
        before = [] if previous is None else [previous.ratios.get(row.label, "—")]
        lines.append(
            cells(
                row.label,
                fmt(real),
                fmt_ratio(row.ratio("real")),
                *before,
                fmt(minimal),
                fmt_ratio(row.ratio("minimal")),
                fmt_percent(overhead),
                fmt_mib(row),
            )
        )
    lines += [
        "",
        "`bahdanau`: query s_{t-1}, the context feeds the RNN; `luong`: query s_t, with input feeding; "
        "`luong-nofeed`: without it (the RNN runs over all steps in one call, attention in one call).",
    ]
    if previous is not None:
        lines.append(previous_note(previous, results.machine))
    return lines


def padding_table(results: Results) -> list[str]:
    lines = [
        "",
        "## Padding and length bucketing",
        "",
        f"Padding over one training epoch (source + target positions): **{100 * results.padding['bucketed']:.1f}%** "
        f"with length bucketing (worst batch {100 * results.padding_worst_batch:.1f}%), "
        f"{100 * results.padding['random']:.1f}% with random batches.",
        "",
        "| minimal loop | bucketed tok/s | random batches tok/s | ×base (random) | bucketing lift |",
        "|---|---:|---:|---:|---:|",
    ]
    random_base = results.rows[BASELINE].median("random")
    for label, row in results.rows.items():
        random_rate, bucketed = row.median("random"), row.median("minimal")
        if random_rate is None:
            continue
        lift = None if bucketed is None else bucketed / random_rate
        lines.append(
            cells(label, fmt(bucketed), fmt(random_rate), fmt_ratio(random_rate / random_base), fmt_ratio(lift))
        )
    return lines


def tried_table(results: Results) -> list[str]:
    unfast = set(without_fast_paths_rows(results).values())
    variants = [row for row in results.rows.values() if row.kept is not None and row.label not in unfast]
    if not variants and not results.compiled:
        return []
    lines = [
        "",
        "## What was tried (measured in lock step with the kept variant and the baseline)",
        "",
        "| variant | loop | tok/s | ×base | vs kept (×base / kept ×base) | overhead |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in variants:
        kept, loop = results.rows.get(row.kept), row.varies
        mine, theirs = row.ratio(loop), None if kept is None else kept.ratio(loop)
        versus = None if mine is None or not theirs else mine / theirs  # a ratio of ×base ratios
        overhead = row.ratio("minimal", "real") if loop == "real" else None
        lines.append(
            cells(row.label, loop, fmt(row.median(loop)), fmt_ratio(mine), fmt_ratio(versus), fmt_percent(overhead))
        )
    for label, entry in results.compiled.items():
        variant = f"{label} (torch.compile, dynamic, first step {entry['compile_s']:.0f} s)"
        compiled = entry["compiled"]
        lines.append(
            cells(
                variant,
                "minimal",
                fmt(compiled),
                fmt_ratio(compiled / entry["base"]),
                fmt_ratio(compiled / entry["plain"]),
                "—",
            )
        )
    return lines


def without_fast_paths_rows(results: Results) -> dict[str, str]:
    """Each measured slow-family case → the label of its row with every fast path off."""
    return {
        case.name: label
        for case in results.settings.cases
        if in_slow_family(case) and (label := without_fast_paths(case).label) in results.rows
    }


UNSERVED_GAIN = 1.05
"""Below this gain the fast paths do not change a case's speed beyond the noise of one run."""


@dataclass(frozen=True)
class Shortfall:
    """A slow-family case against ``SLOW_FAMILIES_GOAL``: its ×base through the real path and the minimal loop,
    and the same model's with every fast path off, all in one lock step."""

    case: str
    real: float
    minimal: float
    unfast: float

    @property
    def gain(self) -> float:
        """What the fast paths buy: the minimal loop over the same loop with them off."""
        return self.minimal / self.unfast

    @property
    def needed(self) -> float:
        """The gain over the loop without fast paths that would bring the real path to the goal, at this case's
        framework overhead (minimal / real)."""
        return SLOW_FAMILIES_GOAL * (self.minimal / self.real) / self.unfast

    def kind(self, largest: Shortfall | None) -> str:
        """``unserved``: no fast path changes this case's speed; ``bounded``: it needs more gain than ``largest``
        (the largest any other case of the run got) got; ``short``: less than that, or no other case measured."""
        if self.gain < UNSERVED_GAIN:
            return "unserved"
        return "bounded" if largest is not None and self.needed > largest.gain else "short"


def shortfalls(results: Results) -> list[Shortfall]:
    """Every slow-family case measured with its fast paths off, in the order of the cases."""
    out = []
    for name, label in without_fast_paths_rows(results).items():
        row = results.rows[name]
        real, minimal, unfast = row.ratio("real"), row.ratio("minimal"), results.rows[label].ratio("minimal")
        if real and minimal and unfast:
            out.append(Shortfall(name, real, minimal, unfast))
    return out


def shortfall_reading(short: Shortfall, largest: Shortfall | None) -> str:
    """Why ``short`` misses the goal, in the terms of the table; ``largest``: the largest gain any other case of the
    run got (None: no other case measured)."""
    needs = f"needs {fmt_ratio(short.needed)} over its loop without them"
    kind = short.kind(largest)
    if kind == "unserved":
        return f"no fast path serves it (gain {fmt_ratio(short.gain)}); {needs}"
    if kind == "bounded":
        return f"bounded: {needs}, more than any other case gets in this run ({fmt_ratio(largest.gain)}, " \
               f"`{largest.case}`)"
    beside = "no other case in this run" if largest is None else \
        f"the largest gain of another case in this run: {fmt_ratio(largest.gain)}"
    return f"short: its fast paths give {fmt_ratio(short.gain)}, it {needs} ({beside})"


def largest_other(entry: Shortfall, measured: list[Shortfall]) -> Shortfall | None:
    """The case of ``measured`` other than ``entry`` whose fast paths gain the most."""
    others = [other for other in measured if other is not entry]
    return max(others, key=lambda other: other.gain) if others else None


def short_of_goal_table(results: Results) -> list[str]:
    measured = shortfalls(results)
    if not measured:
        return []
    largest = max(measured, key=lambda short: short.gain)
    short = [entry for entry in measured if entry.real < SLOW_FAMILIES_GOAL]
    lines = [
        "",
        f"## The slow families' cases short of {SLOW_FAMILIES_GOAL:g}×: what reaching it would take",
        "",
        f"Every case of the slow families ({'; '.join(SLOW_FAMILIES)}) ran a third loop in its lock step: the same "
        f"model with {WITHOUT_FAST_PATHS} (`FastPaths` all False: the decoder stepped one token at a time as the "
        "model is written, torch's GRU and LSTM under autograd). `gain` = the minimal loop over that loop: what the "
        f"fast paths buy this case. `needs` = the gain that would bring the real path to {SLOW_FAMILIES_GOAL:g}× "
        f"the textbook at this case's framework overhead: {SLOW_FAMILIES_GOAL:g} × (minimal / real) / (off ×base). "
        f"{len(measured) - len(short)} of {len(measured)} cases reach the goal; the largest gain is "
        f"{fmt_ratio(largest.gain)} (`{largest.case}`).",
    ]
    if not short:
        return lines
    lines += [
        "",
        "| case | real ×base | minimal ×base | fast paths off ×base | gain | needs | reading |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for entry in sorted(short, key=lambda entry: entry.needed / entry.gain, reverse=True):
        lines.append(cells(entry.case, fmt_ratio(entry.real), fmt_ratio(entry.minimal), fmt_ratio(entry.unfast),
                           fmt_ratio(entry.gain), fmt_ratio(entry.needed),
                           shortfall_reading(entry, largest_other(entry, measured))))
    return lines


def decoding_table(results: Results) -> list[str]:
    single = results.decoding["greedy, one sequence at a time"]
    lines = [
        "",
        f"## Decoding (evaluation mode; {results.decode_case} after a few training steps)",
        "",
        "| decoding | sequences/s | tokens/s | vs one at a time |",
        "|---|---:|---:|---:|",
    ]
    for name, entry in results.decoding.items():
        lines.append(
            cells(name, f"{entry['seq_s']:,.1f}", f"{entry['tok_s']:,.0f}", fmt_ratio(entry["seq_s"] / single["seq_s"]))
        )
    return lines


def transformer_tables(results: Results) -> list[str]:
    """The Transformer beside ``nn.Transformer``: training in lock step, then decoding."""
    found = results.transformer
    if not found:
        return []
    label, rows, params = found["label"], results.rows, found["parameters"]
    size = ", ".join(f"{key} {value}" for key, value in found["config"].items())
    (first, first_ref), (last, last_ref) = found["losses"]
    lines = [
        "",
        f"## The Transformer beside nn.Transformer ({label}; {size}; emb {results.settings.sizes[0]} / "
        f"d {results.settings.sizes[1]})",
        "",
        f"`{REFERENCE}`: `transformer_reference.TextbookTransformer`, a plain `nn.Transformer(norm_first=True)` "
        "between √E-scaled embeddings plus a precomputed sinusoidal table and a linear output layer, with the same "
        "sizes, loss, optimizer and clipping, started from attnseq's initial weights (copied) and trained in lock "
        f"step with attnseq's real path, its minimal loop and the textbook baseline on the same {found['steps']} "
        f"batches ({found['tokens']:,} target tokens, the same in both loops: "
        f"{'yes' if found['same_tokens'] else 'NO'}); first-step loss {first:.5f} vs {first_ref:.5f}, last "
        f"{last:.5f} vs {last_ref:.5f}. Parameters: attnseq {params['attnseq']:,}, {REFERENCE} "
        f"{params[REFERENCE]:,} — by design attnseq's encoder has a bridge to an RNN decoder's first state "
        f"({params['bridge']:,}, unused by decoder=transformer) and torch's attentions a key bias "
        f"({params['key_biases']:,}, no effect on the output).",
        "",
        f"| training loop | target tokens/s | × {REFERENCE} | ×base | activations MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    ours = rows[label]
    for name, row, loop, ratio in [
        ("attnseq, real path (Lightning + MLflow)", ours, "real", results.transformer_ratio("real")),
        ("attnseq, minimal loop", ours, "minimal", results.transformer_ratio("minimal")),
        (f"{REFERENCE}, minimal loop", rows[REFERENCE], "minimal", 1.0),
    ]:
        lines.append(cells(name, fmt(row.median(loop)), fmt_ratio(ratio), fmt_ratio(row.ratio(loop)), fmt_mib(row)))
    lines += [
        "",
        f"`× {REFERENCE}`: the median over the timed windows of each window's ratio, both loops timed over the same "
        "steps (on a machine whose load moves, it differs from the ratio of the medians beside it); `×base`: the "
        "ratio to the textbook baseline in this run.",
    ]
    decoded = found["decoding"]
    runs = {name: entry for name, entry in decoded.items() if isinstance(entry, dict)}
    reference = next(entry for name, entry in runs.items() if name.startswith(REFERENCE))
    lines += [
        "",
        f"Decoding {decoded['sequences']} training sources after that training, in batches of 64, the length "
        f"limits of evaluation; each decoder in turn, medians of {results.settings.decode_repeats} rounds. The "
        f"reference decodes with attnseq's trained weights copied in: its greedy output equals attnseq's for "
        f"{decoded['same greedy output']} of {decoded['sequences']} sequences. The RNN decoder: the decoding "
        f"section's {results.decode_case}, after its own few training steps.",
        "",
        f"| decoding | sequences/s | tokens/s | vs {REFERENCE} greedy (sequences/s) |",
        "|---|---:|---:|---:|",
    ]
    for name, entry in runs.items():
        lines.append(cells(name, f"{entry['seq_s']:,.1f}", f"{entry['tok_s']:,.0f}",
                           fmt_ratio(entry["seq_s"] / reference["seq_s"])))
    return lines


def check(text: str, value: float | None, goal: float, at_most: bool = False, percent: bool = False) -> str:
    """One line of the targets: ``value`` against ``goal`` (at least, or ``at_most``)."""
    if value is None:
        return f"- {text}: not measured in this run"
    met = value <= goal if at_most else value >= goal
    shown, unit = (f"{value:.1f}%", "%") if percent else (f"{value:.2f}×", "×")
    return f"- {text}: **{shown}** (goal {'≤' if at_most else '≥'} {goal:g}{unit}): {'met' if met else 'NOT met'}"


def real_ratio(results: Results, case: Case) -> float | None:
    row = results.rows.get(case.name)
    return None if row is None else row.ratio("real")


def targets(results: Results) -> list[str]:
    out = [
        check(
            f"Bahdanau additive ({KEY_ADDITIVE.name}), real path vs the textbook baseline",
            real_ratio(results, KEY_ADDITIVE),
            1.8,
        )
    ]
    for case in (KEY_DOT, KEY_GENERAL):
        out.append(
            check(
                f"Luong {case.scorer} without input feeding ({case.name}), real path vs the baseline",
                real_ratio(results, case),
                3.0,
            )
        )
    overheads = [
        (100 * (ratio - 1), row.label)
        for row in results.rows.values()
        if row.kept is None and (ratio := row.ratio("minimal", "real")) is not None
    ]
    if overheads:
        worst, label = max(overheads)
        median = statistics.median(overhead for overhead, _ in overheads)
        out.append(
            check(
                f"framework overhead, median over cases ({median:+.1f}%); worst ({label})",
                worst,
                10.0,
                at_most=True,
                percent=True,
            )
        )
    decoded = results.decoding
    out.append(
        check(
            "batched greedy decoding vs one sequence at a time",
            decoded["greedy, batches of 64"]["seq_s"] / decoded["greedy, one sequence at a time"]["seq_s"],
            5.0,
        )
    )
    out.append(
        check("padding with length bucketing", 100 * results.padding["bucketed"], 10.0, at_most=True, percent=True)
    )
    out += slow_families(results)
    return out


def slow_families(results: Results) -> list[str]:
    """The LSTM cases and biGRU + Luong + additive/concat against ``SLOW_FAMILIES_GOAL``: the worst
    of each family, and how many reach it."""
    out = []
    for text, member in SLOW_FAMILIES.items():
        measured = [(ratio, case.name) for case in results.settings.cases
                    if member(case) and (ratio := real_ratio(results, case)) is not None]
        if not measured:
            continue
        worst, name = min(measured)
        reached = sum(ratio >= SLOW_FAMILIES_GOAL for ratio, _ in measured)
        out.append(check(f"{text}, real path vs the baseline: {reached} of {len(measured)} cases reach it; "
                         f"the slowest ({name})", worst, SLOW_FAMILIES_GOAL))
    return out
