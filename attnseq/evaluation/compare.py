"""Side by side: one figure with every run's accuracy-vs-length curve, and one table (Markdown
and CSV) with the choices, size, training time, best validation accuracy and per-bucket
evaluation accuracy of each run — readable without opening the MLflow UI."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import Run

from attnseq.evaluation.evaluator import EvalResult
from attnseq.evaluation.trained_runs import TrainedRun
from attnseq.tracking.plots import accuracy_vs_length, save_figure

IGNORED_PREFIXES = ("paths.", "mlflow.", "hydra.", "tracking.", "trainer.enable_", "model.num_parameters")


@dataclass
class Compared:
    trained: TrainedRun
    result: EvalResult
    label: str


def differing_params(runs: Sequence[Run]) -> list[str]:
    """Config keys whose values differ between the runs: what a sweep varied."""
    keys = sorted(set().union(*(r.data.params for r in runs)))
    varying = []
    for key in keys:
        if key.startswith(IGNORED_PREFIXES):
            continue
        if any(key not in r.data.params for r in runs):
            continue  # a setting only some group choices have (scorer.attn_dim): the choice itself varies
        if len({r.data.params.get(key) for r in runs}) > 1:
            varying.append(key)
    return varying


def run_label(run: Run, keys: Sequence[str]) -> str:
    """``scorer=dot model.heads=4`` from the varying keys (``scorer.name`` reads as ``scorer``)."""
    if not keys:
        return run.info.run_name or run.info.run_id[:8]
    return " ".join(f"{k.removesuffix('.name')}={run.data.params.get(k)}" for k in keys)


def label_runs(trained: Sequence[TrainedRun], results: Sequence[EvalResult]) -> list[Compared]:
    keys = differing_params([t.run for t in trained])
    labels = [run_label(t.run, keys) for t in trained]
    if len(set(labels)) < len(labels):  # same choices, e.g. seeds not varied: keep them apart
        labels = [f"{label} ({t.run_id[:6]})" for label, t in zip(labels, trained)]
    return [Compared(t, r, label) for t, r, label in zip(trained, results, labels)]


def table_rows(compared: Sequence[Compared]) -> tuple[list[str], list[list[str]]]:
    bucket_columns = [f"acc {row['lo']}-{row['hi']}" for row in compared[0].result.bucket_rows]
    header = ["run", "scorer", "encoder", "decoder", "heads", "params", "train min", "best val acc",
              "eval acc", "eval exact", *bucket_columns]
    rows = []
    for item in compared:
        run, cfg, metrics = item.trained.run, item.trained.config, item.result.metrics
        minutes = (run.info.end_time - run.info.start_time) / 60000 if run.info.end_time else float("nan")
        best = run.data.metrics.get("val/acc_best")
        by_bucket = {f"acc {r['lo']}-{r['hi']}": r["acc"] for r in item.result.bucket_rows}
        rows.append([
            item.label,
            cfg["scorer"]["name"],
            cfg["encoder"]["name"],
            cfg["decoder"]["convention"] if cfg["scorer"]["name"] != "none" else "-",
            str(cfg["model"]["heads"]) if cfg["scorer"]["name"] != "none" else "-",
            f"{item.trained.model.num_parameters():,}",
            f"{minutes:.1f}",
            "-" if best is None else f"{best:.3f}",
            f"{metrics.get('eval/acc', float('nan')):.3f}",
            f"{metrics.get('eval/exact_match', float('nan')):.3f}",
            *("-" if by_bucket.get(c) is None else f"{by_bucket[c]:.3f}" for c in bucket_columns),
        ])
    return header, rows


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_comparison(compared: Sequence[Compared], out_dir: Path, title: str) -> dict[str, Path]:
    """The figure(s) and tables, written to ``out_dir``; returns their paths by kind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    header, rows = table_rows(compared)
    paths = {"markdown": out_dir / "comparison.md", "csv": out_dir / "comparison.csv",
             "figure": out_dir / "comparison.png"}
    paths["markdown"].write_text(markdown_table(header, rows))
    with paths["csv"].open("w", newline="") as handle:
        csv.writer(handle).writerows([header, *rows])
    train_ranges = {c.trained.train_lengths for c in compared}
    shade = train_ranges.pop() if len(train_ranges) == 1 else None
    curves = {c.label: c.result.bucket_rows for c in compared}
    save_figure(accuracy_vs_length(curves, shade, f"{title}: token accuracy vs source length"), paths["figure"])
    if any(c.result.counterfactual for c in compared):
        paths["counterfactual"] = out_dir / "counterfactual.png"
        figure = accuracy_vs_length(
            curves, shade, f"{title}: prediction flips when attention is made uniform",
            metric="cf_uniform_flip_rate", ylabel="flip rate (uniform attention)",
        )
        save_figure(figure, paths["counterfactual"])
    return paths
