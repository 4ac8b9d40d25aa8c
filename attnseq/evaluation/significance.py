"""The comparison's significance: for each pair of groups and metric, the paired bootstrap over the
test sequences both decoded and, over several seeds, Welch's t (``attnseq.metrics.significance``),
as ``significance.csv`` / ``significance.md`` and the p-value matrix ``significance.png``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from attnseq.data.tasks import TASKS
from attnseq.evaluation.compare import SeedGroup, markdown_table, write_csv
from attnseq.metrics.significance import ALPHA, COUNTED, TEXT, GroupRuns, p_matrix, significance_rows
from attnseq.tracking.plots import save_figure
from attnseq.tracking.significance_plot import p_value_matrices

METRIC_NAMES = {"acc": "token accuracy", "exact_match": "exact match", "sacrebleu": "sacreBLEU", "chrf": "chrF",
                "ter": "TER"}
NOTE = (f"difference: b − a on the sequences both decoded (paired runs pooled); interval: 95% bootstrap "
        f"percentiles (exact match, accuracy); p (bootstrap): sacreBLEU's paired bootstrap (text scores, on text "
        f"tasks of words only); p (Welch): over the seeds' own values, where both groups have ≥ 2 runs. Call a "
        f"difference only where p < {ALPHA:g}.")


def compared_as_text(task: str) -> bool:
    """Whether the registry's ``task`` has its text scores tested: a text task (``is_text``) of words, not
    symbols (``is_symbolic``: ``reverse`` reports sacreBLEU as JoeyNMT does, but its exact match and token
    accuracy, tested anyway, say what its BLEU says, at a fraction of the cost)."""
    declared = TASKS.lookup(task)
    return declared.is_text and not declared.is_symbolic


def group_runs_of(groups: Sequence[SeedGroup]) -> list[GroupRuns]:
    """Each group's runs as the tests read them: their overall ``eval/`` values and sequence outcomes, and
    whether every run's task is compared as text (``compared_as_text``)."""
    found = []
    for group in groups:
        text = all(compared_as_text(m.trained.config["dataset"]["task"]) for m in group.members)
        names = (*COUNTED, *TEXT) if text else COUNTED
        found.append(GroupRuns(group.name,
                               [{name: m.result.metrics.get(f"eval/{name}") for name in names} for m in group.members],
                               [m.result.outcomes for m in group.members], text))
    return found


def markdown_rows(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    def cell(value, digits=4) -> str:
        return "-" if value is None else f"{value:.{digits}g}"

    header = ["a", "b", "metric", "difference (b − a)", "95% interval", "p (bootstrap)", "p (Welch)", "runs paired",
              "sequences"]
    body = [[row["group_a"], row["group_b"], METRIC_NAMES[row["metric"]], cell(row["difference"]),
             "-" if row["ci95_low"] is None else f"[{row['ci95_low']:.4g}, {row['ci95_high']:.4g}]",
             cell(row["p_bootstrap"], 3), cell(row["p_welch"], 3), str(row["paired_runs"]), str(row["sequences"])]
            for row in rows]
    return header, body


def write_significance(groups: Sequence[SeedGroup], out_dir: Path, samples: int, seed: int,
                       title: str) -> dict[str, Path]:
    """The tests' table (CSV and Markdown) and p-value matrix, in ``out_dir``; their paths by kind (none
    with fewer than two groups)."""
    if len(groups) < 2:
        return {}
    runs = group_runs_of(groups)
    rows = significance_rows(runs, samples, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"significance_csv": out_dir / "significance.csv", "significance_markdown": out_dir / "significance.md",
             "significance_figure": out_dir / "significance.png"}
    write_csv(rows, paths["significance_csv"])
    header, body = markdown_rows(rows)
    paths["significance_markdown"].write_text(f"{markdown_table(header, body)}\n{NOTE}\n")
    names = [group.name for group in runs]
    metrics = [m for m in (*COUNTED, *TEXT) if any(row["metric"] == m for row in rows)]
    panels = {METRIC_NAMES[m]: (p_matrix(rows, names, m, "p_bootstrap"), p_matrix(rows, names, m, "p_welch"))
              for m in metrics}
    if panels:
        save_figure(p_value_matrices(names, panels, title, ALPHA), paths["significance_figure"])
    else:
        del paths["significance_figure"]
    return paths
