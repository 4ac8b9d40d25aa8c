"""Side by side: evaluated runs grouped by what they vary, tables (Markdown and CSV) and figures
readable without opening the MLflow UI.

Runs that differ only in ``seed`` form one group. Each group shows the mean over its seeds and the
95% interval of that mean, per length bucket and overall: Student's t, half-width
``t_{0.975, n-1} · s / √n`` with ``s`` the sample standard deviation of the n seeds' values. Each
seed trains its own model and draws its own evaluation set, so the interval covers both. A group
of one seed shows its value alone: no interval, no band. ``comparison_runs.csv`` keeps every run's
own values, so the aggregation hides nothing.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import Run
from scipy import stats

from attnseq.evaluation.evaluator import EvalResult
from attnseq.evaluation.trained_runs import TrainedRun
from attnseq.metrics.declarations import names
from attnseq.tracking import tags
from attnseq.tracking.plots import accuracy_vs_length, curve_colours, metrics_vs_length, save_figure

IGNORED_PREFIXES = ("paths.", "mlflow.", "hydra.", "tracking.", "trainer.enable_", "model.num_parameters", "attnseq.")
"""Params that say nothing of what was trained (``attnseq.resume_claim.<n>``: who resumed a run)."""
SEED_PARAM = "seed"
"""The run param holding a run's seed: never part of a label; runs differing only in it are one group."""
CONFIDENCE = 0.95
MEAN, HALF_WIDTH = "_mean", "_ci95"
"""Suffixes of a quantity's group mean and interval half-width, in CSV columns and curve rows."""

BUCKET_KEYS = ("bucket", "lo", "hi")
"""What names a bucket row; every other numeric column of the rows is aggregated."""
TRAIN_MINUTES = "train_min"
BEST_VAL_ACC = "val/acc_best"
TABLE_COLUMNS = {TRAIN_MINUTES: "train min", BEST_VAL_ACC: "best val acc", "eval/acc": "eval acc",
                 "eval/exact_match": "eval exact"}
TEXT_COLUMNS = {"eval/sacrebleu": "sacreBLEU", "eval/chrf": "chrF", "eval/ter": "TER"}
"""Added to the table when the runs were scored on text (0-100, one decimal)."""
"""The overall quantities the Markdown table shows (the CSV has them all), with their headers."""
DIAGNOSTIC_COLUMNS = {"attn_entropy": "entropy (nats)", "attn_margin": "top-1 − top-2 margin",
                      "align_acc": "align acc", "align_acc_near": "align acc ±1", "align_offset": "argmax − gold"}
"""The attention diagnostics the diagnostics table shows per bucket, with their headers."""
DIAGNOSTIC_PANELS = (("attn_entropy", "attention entropy (nats)"), ("attn_margin", "top-1 − top-2 margin"))
OVERALL_BUCKET = "all"
"""The diagnostics table's row for the whole evaluation (the run's ``eval/`` metrics)."""
INTERVAL_NOTE = (f"Cells: mean ± half-width of the {CONFIDENCE:.0%} t interval of the mean across seeds; "
                 "a group of one seed shows its value alone.")


# -- the interval --------------------------------------------------------------------------
@dataclass(frozen=True)
class Interval:
    """The mean of ``n`` values and the half-width of its confidence interval (None when n = 1)."""

    mean: float
    half_width: float | None
    n: int

    def format(self, digits: int = 3) -> str:
        if self.half_width is None:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"


def mean_interval(values: Iterable[float | None]) -> Interval | None:
    """Mean and t-interval half-width of the values; missing ones (None, NaN: an empty bucket) are
    skipped, never read as 0. None when no value is left."""
    present = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not present:
        return None
    n = len(present)
    mean = statistics.fmean(present)
    if n == 1:
        return Interval(mean, None, 1)
    t = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1))
    return Interval(mean, t * statistics.stdev(present) / math.sqrt(n), n)


def format_interval(interval: Interval | None, digits: int = 3) -> str:
    return "-" if interval is None else interval.format(digits)


# -- one run, and the groups -----------------------------------------------------------------
@dataclass
class Compared:
    """One evaluated run."""

    trained: TrainedRun
    result: EvalResult

    @property
    def seed(self) -> str:
        return self.trained.run.data.params.get(SEED_PARAM, "-")

    def overall(self) -> dict[str, float | None]:
        """Training minutes, best validation accuracy, every overall ``eval/`` metric (the per-bucket
        ones, ``eval/acc_len/01-05``, are in the bucket rows) and the overall ``faith``."""
        run = self.trained.run
        minutes = (run.info.end_time - run.info.start_time) / 60000 if run.info.end_time else None
        values = {TRAIN_MINUTES: minutes, BEST_VAL_ACC: run.data.metrics.get(BEST_VAL_ACC)}
        values.update({key: value for key, value in self.result.metrics.items() if key.count("/") == 1})
        return values | self.faith()

    def faith(self, buckets: bool = False) -> dict[str, float | None]:
        """``eval/faith/...``: every name the metric registry's faithfulness metrics declare for this
        evaluation (``names(spec, needs_faith=True)``), overall or, with ``buckets``, per length bucket
        (``eval/faith/adversarial_jsd_len/01-05``), with its value; None where the run reports none (a τ
        whose every step was NaN). Nothing for a result without its spec."""
        spec = self.result.spec
        if spec is None:
            return {}
        overall = names(spec, buckets=False, needs_faith=True)
        picked = overall if not buckets else [n for n in names(spec, needs_faith=True) if n not in overall]
        return {name: self.result.metrics.get(name) for name in picked}

    def buckets(self) -> dict[tuple[int, int], dict]:
        return {(row["lo"], row["hi"]): row for row in self.result.bucket_rows}


@dataclass
class SeedGroup:
    """Runs with the same label: the same choices, any seeds."""

    label: str
    members: list[Compared]

    @property
    def seeds(self) -> list[str]:
        return [member.seed for member in self.members]

    @property
    def name(self) -> str:
        """The label, with the number of seeds when there are several: ``scorer=dot (3 seeds)``."""
        runs, seeds = len(self.members), len(set(self.seeds))
        if runs == 1:
            return self.label
        return f"{self.label} ({runs} seeds)" if seeds == runs else f"{self.label} ({runs} runs, {seeds} seeds)"

    @property
    def first(self) -> Compared:
        return self.members[0]

    def overall(self) -> dict[str, Interval | None]:
        """Every overall quantity (``Compared.overall``) across the group's seeds."""
        per_run = [member.overall() for member in self.members]
        return {key: mean_interval(values.get(key) for values in per_run) for key in _ordered_keys(per_run)}

    def faith_buckets(self) -> dict[str, Interval | None]:
        """The members' per-bucket ``Compared.faith`` across the group's seeds."""
        per_run = [member.faith(buckets=True) for member in self.members]
        return {key: mean_interval(values.get(key) for values in per_run) for key in _ordered_keys(per_run)}

    def buckets(self) -> list[dict]:
        """One row per bucket any member has: ``bucket``, ``lo``, ``hi`` and an ``Interval`` (or None)
        for every numeric column."""
        per_run = [member.buckets() for member in self.members]
        rows = []
        for bounds in sorted(set().union(*per_run)):
            rows_here = [buckets[bounds] for buckets in per_run if bounds in buckets]
            row = {key: rows_here[0][key] for key in BUCKET_KEYS if key in rows_here[0]}
            for column in numeric_columns(rows_here):
                row[column] = mean_interval(r.get(column) for r in rows_here)
            rows.append(row)
        return rows

    def curve_rows(self) -> list[dict]:
        """``buckets()`` flattened for plots and CSV: ``<column>_mean`` and ``<column>_ci95`` (None
        without an interval)."""
        rows = []
        for row in self.buckets():
            named = {key: row[key] for key in BUCKET_KEYS if key in row}
            rows.append(named | _flat({key: value for key, value in row.items() if key not in BUCKET_KEYS}))
        return rows

    def has_diagnostics(self) -> bool:
        return any(row.get(column) is not None for row in self.buckets() for column in DIAGNOSTIC_COLUMNS)


def numeric_columns(rows: Sequence[Mapping]) -> list[str]:
    """The columns other than the bucket's name and bounds whose values are all numbers or None."""
    columns = [key for key in _ordered_keys(rows) if key not in BUCKET_KEYS]
    return [c for c in columns if all(r.get(c) is None or _is_number(r[c]) for r in rows)]


def differing_params(runs: Sequence[Run]) -> list[str]:
    """Config keys whose values differ between the runs that have them: what a sweep varied (the
    seed included). A key only some runs have (``scorer.attn_dim``) counts where its values differ.
    When a config group's option varies (its ``CHOICE_KEYS`` key, ``encoder.name``), a setting of
    that group with one value per option (``encoder.bidirectional``) is left out: the option says it."""
    keys = sorted(set().union(*(r.data.params for r in runs)))
    varying = []
    for key in keys:
        if key.startswith(IGNORED_PREFIXES):
            continue
        if len({r.data.params[key] for r in runs if key in r.data.params}) > 1:
            varying.append(key)
    choices = {choice_group(key): key for key in varying if choice_group(key)}

    def implied(key: str) -> bool:  # one value per option of its group: the option says it
        choice = choices.get(key.split(".", 1)[0])
        if choice is None or choice == key:
            return False
        seen: dict[str | None, set[str | None]] = {}
        for run in runs:
            seen.setdefault(run.data.params.get(choice), set()).add(run.data.params.get(key))
        return all(len(values) == 1 for values in seen.values())

    return [key for key in varying if not implied(key)]


CHOICE_KEYS = ("name", "convention", "task")
"""The key by which an option of a config group names itself (``encoder.name``, ``decoder.convention``,
``dataset.task``): a label shows it as the choice, ``encoder=bigru``."""


def choice_group(key: str) -> str | None:
    """The config group whose option ``key`` names, or None."""
    group, _, leaf = key.partition(".")
    return group if leaf in CHOICE_KEYS else None


def run_label(run: Run, keys: Sequence[str]) -> str:
    """``scorer=dot model.heads=4`` from the varying keys the run has (``scorer.name`` reads as
    ``scorer``); the run's choices (``copy-gru-dot-bahdanau-h1``) when nothing but the seed varies."""
    shown = [key for key in keys if key in run.data.params]
    if not shown:
        return run.data.tags.get(tags.CHOICES) or "same config"
    return " ".join(f"{choice_group(key) or key}={run.data.params[key]}" for key in shown)


def group_runs(trained: Sequence[TrainedRun], results: Sequence[EvalResult]) -> list[SeedGroup]:
    """Runs labelled by what varied apart from the seed; the same label is one group. Groups keep
    the order their first run came in."""
    keys = [key for key in differing_params([t.run for t in trained]) if key != SEED_PARAM]
    groups: dict[str, SeedGroup] = {}
    for run, result in zip(trained, results):
        label = run_label(run.run, keys)
        groups.setdefault(label, SeedGroup(label, [])).members.append(Compared(run, result))
    return list(groups.values())


# -- tables ------------------------------------------------------------------------------------
def bucket_label(row: Mapping) -> str:
    return str(row.get("bucket") or f"{row['lo']}-{row['hi']}")


def all_buckets(groups: Sequence[SeedGroup]) -> list[tuple[tuple[int, int], str]]:
    """Every bucket any group has, by bounds, with its name."""
    named = {(row["lo"], row["hi"]): bucket_label(row) for group in groups for row in group.buckets()}
    return sorted(named.items())


def choice_cells(group: SeedGroup) -> dict[str, str]:
    cfg = group.first.trained.config
    attends = cfg["scorer"]["name"] != "none"
    return {
        "scorer": cfg["scorer"]["name"],
        "encoder": cfg["encoder"]["name"],
        "decoder": cfg["decoder"]["convention"] if attends else "-",
        "heads": str(cfg["model"]["heads"]) if attends else "-",
        "params": f"{group.first.trained.model.num_parameters():,}",
    }


def table_rows(groups: Sequence[SeedGroup]) -> tuple[list[str], list[list[str]]]:
    """The Markdown/terminal table: one row per group, cells ``mean ± half-width``."""
    buckets = all_buckets(groups)
    text = [key for key in TEXT_COLUMNS if any(group.overall().get(key) is not None for group in groups)]
    header = ["group", "seeds", "scorer", "encoder", "decoder", "heads", "params", *TABLE_COLUMNS.values(),
              *(TEXT_COLUMNS[key] for key in text), *(f"acc {name}" for _, name in buckets)]
    rows = []
    for group in groups:
        overall = group.overall()
        by_bounds = {(row["lo"], row["hi"]): row.get("acc") for row in group.buckets()}
        rows.append([
            group.name,
            str(len(group.members)),
            *choice_cells(group).values(),
            *(format_interval(overall.get(key), 1 if key == TRAIN_MINUTES else 3) for key in TABLE_COLUMNS),
            *(format_interval(overall.get(key), 1) for key in text),
            *(format_interval(by_bounds.get(bounds)) for bounds, _ in buckets),
        ])
    return header, rows


def group_csv_rows(groups: Sequence[SeedGroup]) -> list[dict]:
    """``comparison.csv``: one row per group, ``<quantity>_mean`` and ``<quantity>_ci95`` for every
    overall quantity, every bucket column (``acc/01-05_mean``) and every ``eval/faith/...`` name the metric
    registry declares per bucket (``SeedGroup.faith_buckets``), empty where there is none."""
    rows = []
    for group in groups:
        row = {"group": group.label, "n_seeds": len(group.members), "seeds": " ".join(group.seeds)}
        row |= choice_cells(group)
        row["params"] = group.first.trained.model.num_parameters()
        row |= _flat(group.overall())
        for bucket in group.buckets():
            row |= _flat({f"{column}/{bucket_label(bucket)}": bucket[column] for column in bucket
                          if column not in BUCKET_KEYS})
        row |= _flat(group.faith_buckets())
        rows.append(row)
    return rows


def run_csv_rows(groups: Sequence[SeedGroup]) -> list[dict]:
    """``comparison_runs.csv``: one row per run, its own values, nothing aggregated."""
    rows = []
    for group in groups:
        for member in group.members:
            row = {"group": group.label, "run_id": member.trained.run_id, "run_name": member.trained.name,
                   "seed": member.seed}
            row |= member.overall()
            for bucket in member.result.bucket_rows:
                row |= {f"{column}/{bucket_label(bucket)}": bucket[column]
                        for column in numeric_columns([bucket])}
            row |= member.faith(buckets=True)
            rows.append(row)
    return rows


def diagnostics_rows(groups: Sequence[SeedGroup]) -> tuple[list[str], list[list[str]], list[dict]]:
    """Per attending group and bucket (and over all lengths), the attention diagnostics: the
    Markdown header and rows, and the CSV rows."""
    header = ["group", "seeds", "bucket", *DIAGNOSTIC_COLUMNS.values()]
    rows, csv_rows = [], []
    for group in groups:
        if not group.has_diagnostics():
            continue
        overall = group.overall()
        whole = {"bucket": OVERALL_BUCKET} | {column: overall.get(f"eval/{column}") for column in DIAGNOSTIC_COLUMNS}
        for bucket in [*group.buckets(), whole]:
            cells = {column: bucket.get(column) for column in DIAGNOSTIC_COLUMNS}
            name = bucket_label(bucket)
            rows.append([group.name, str(len(group.members)), name, *map(format_interval, cells.values())])
            csv_rows.append({"group": group.label, "n_seeds": len(group.members), "bucket": name,
                             "lo": bucket.get("lo"), "hi": bucket.get("hi")} | _flat(cells))
    return header, rows, csv_rows


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[Mapping], path: Path) -> None:
    """Columns in order of first appearance; a missing value is an empty cell."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=_ordered_keys(rows), restval="")
        writer.writeheader()
        writer.writerows({key: "" if value is None else value for key, value in row.items()} for row in rows)


# -- everything, written -----------------------------------------------------------------------
def write_comparison(groups: Sequence[SeedGroup], out_dir: Path, title: str) -> dict[str, Path]:
    """The tables and figures, written to ``out_dir``; returns their paths by kind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out_dir / "comparison.md", "csv": out_dir / "comparison.csv",
             "runs_csv": out_dir / "comparison_runs.csv", "figure": out_dir / "comparison.png"}
    header, rows = table_rows(groups)
    paths["markdown"].write_text(f"{markdown_table(header, rows)}\n{INTERVAL_NOTE}\n")
    write_csv(group_csv_rows(groups), paths["csv"])
    write_csv(run_csv_rows(groups), paths["runs_csv"])

    train_ranges = {member.trained.train_lengths for group in groups for member in group.members}
    shade = train_ranges.pop() if len(train_ranges) == 1 else None
    colours = curve_colours([group.name for group in groups])  # one colour per group in every figure
    curves = {group.name: group.curve_rows() for group in groups}
    figure = accuracy_vs_length(curves, shade, f"{title}: token accuracy vs source length (mean, 95% interval)",
                                metric="acc" + MEAN, half_width="acc" + HALF_WIDTH, colours=colours)
    save_figure(figure, paths["figure"])
    if any(member.result.counterfactual for group in groups for member in group.members):
        paths["counterfactual"] = out_dir / "counterfactual.png"
        figure = accuracy_vs_length(
            curves, shade, f"{title}: prediction flips when attention is made uniform",
            metric="cf_uniform_flip_rate" + MEAN, half_width="cf_uniform_flip_rate" + HALF_WIDTH,
            ylabel="flip rate (uniform attention)", colours=colours,
        )
        save_figure(figure, paths["counterfactual"])
    header, rows, csv_rows = diagnostics_rows(groups)
    if rows:
        paths["diagnostics_markdown"] = out_dir / "diagnostics.md"
        paths["diagnostics_csv"] = out_dir / "diagnostics.csv"
        paths["diagnostics_figure"] = out_dir / "diagnostics.png"
        paths["diagnostics_markdown"].write_text(f"{markdown_table(header, rows)}\n{INTERVAL_NOTE}\n")
        write_csv(csv_rows, paths["diagnostics_csv"])
        attending = {group.name: curves[group.name] for group in groups if group.has_diagnostics()}
        panels = [(column + MEAN, column + HALF_WIDTH, ylabel) for column, ylabel in DIAGNOSTIC_PANELS]
        figure = metrics_vs_length(attending, shade, f"{title}: attention diagnostics vs source length", panels,
                                   colours=colours)
        save_figure(figure, paths["diagnostics_figure"])
    return paths


def metric_label(label: str) -> str:
    """A group label as MLflow accepts it in a metric name: ``scorer=dot`` → ``scorer_dot``."""
    return re.sub(r"[^\w.\- ]", "_", label)


# -- helpers -----------------------------------------------------------------------------------
def _flat(values: Mapping[str, Interval | None]) -> dict[str, float | None]:
    flat: dict[str, float | None] = {}
    for key, interval in values.items():
        flat[key + MEAN] = None if interval is None else interval.mean
        flat[key + HALF_WIDTH] = None if interval is None else interval.half_width
    return flat


def _ordered_keys(rows: Iterable[Mapping]) -> list[str]:
    return list(dict.fromkeys(key for row in rows for key in row))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
