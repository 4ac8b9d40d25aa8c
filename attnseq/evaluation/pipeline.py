"""``evaluate(cfg)``: validate the config once into the typed ``EvalConfig``, select runs, rebuild each
model from its artifacts, evaluate it, log an evaluation run nested under it, and compare the runs side by
side. ``evaluate.py`` is the thin Hydra entry point over it; its runtime's signal handler (``attnseq.runtime``)
is what makes a SIGTERM or Ctrl-C leave an evaluation or comparison run KILLED (``recorded``), as an
error leaves it FAILED."""

from __future__ import annotations

import csv
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from matplotlib.figure import Figure
from omegaconf import DictConfig
from tqdm import tqdm

from attnseq.config import EvalConfig
from attnseq.data import Example
from attnseq.data.tokenizers import output_text
from attnseq.data.vocab import BOS_TOKEN, EOS_TOKEN
from attnseq.evaluation.compare import (
    HALF_WIDTH,
    INTERVAL_NOTE,
    Compared,
    SeedGroup,
    group_runs,
    markdown_table,
    metric_label,
    table_rows,
    write_comparison,
)
from attnseq.evaluation.evaluator import N_BEST_COLUMNS, EvalResult, EvalSettings, evaluate_run, self_attention_of
from attnseq.evaluation.significance import write_significance
from attnseq.evaluation.trained_runs import TrainedRun, chosen_runs, load_trained_run
from attnseq.evaluation.validation import check_config
from attnseq.faithfulness.explorer import reference_attention
from attnseq.lifecycle.signals import Signals, exit_code, release_interrupted_frames, signal_name
from attnseq.model import Decoded
from attnseq.tracking import paths, tags
from attnseq.tracking.client import TrackingClient
from attnseq.tracking.explorer import comparison_explorer_html, explorer_html
from attnseq.tracking.length_curves import log_length_curves
from attnseq.tracking.plots import (
    accuracy_vs_length,
    attention_heatmap,
    figure_to_array,
    same_sample_heatmaps,
    same_sample_self_attention,
    save_figure,
    self_attention_heatmaps,
)
from attnseq.tracking.provenance import runtime_params
from attnseq.tracking.redaction import redact_text
from attnseq.tracking.run import TrackedRun
from attnseq.tracking.store import check_store_to_read, ui_links


def settings_for(cfg: EvalConfig, trained: TrainedRun) -> EvalSettings:
    """The evaluation settings for one run: by default, lengths up to twice the run's longest training
    length and the run's own buckets."""
    lo, hi = cfg.eval.lengths or (1, 2 * trained.train_lengths[1])
    return EvalSettings(
        lengths=(lo, hi),
        bucket_width=cfg.eval.bucket_width or int(trained.config["dataset"]["bucket_width"]),
        size=cfg.eval.size,
        batch_size=cfg.eval.batch_size,
        beam_size=cfg.eval.beam_size,
        length_penalty=cfg.eval.length_penalty,
        n_best=cfg.eval.n_best,
        counterfactual=cfg.eval.counterfactual,
        seed=cfg.eval.seed,
        sentences=tuple(cfg.eval.sentences),
        faith=cfg.faith,
        explorer_samples=cfg.eval.explorer_samples,
    )


def write_n_best_file(rows: list[dict], folder: Path) -> Path:
    """The n-best table (``N_BEST_COLUMNS``, a row per example and rank) as ``paths.N_BEST_TABLE``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / paths.N_BEST_TABLE
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(N_BEST_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_bucket_files(rows: list[dict], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = folder / "buckets.json", folder / "buckets.csv"
    json_path.write_text(json.dumps(rows, indent=2))
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return [json_path, csv_path]


@contextmanager
def recorded(create: Callable[[], TrackedRun], signals: Signals | None = None) -> Iterator[TrackedRun]:
    """The run ``create`` makes (a signal meanwhile waits until it exists), FINISHED when the block ends:
    KILLED when a signal stopped the block, which then exits 143 / 130, and FAILED when an error did.
    ``signals``: the entry point's; without them (not installed) only a Ctrl-C reaches the block."""
    signals = signals or Signals()
    run = None
    try:
        with signals.held():
            run = create()
        yield run
    except BaseException as error:
        interrupted = signals.received is not None or signals.is_interrupt(error)
        if interrupted:
            signals.mark_raised()  # a second signal must not cut the marking short
            release_interrupted_frames(error)  # an interrupted store call must not lock the store
        if run is not None:
            run.finish("KILLED" if interrupted else "FAILED")
        if not interrupted:
            raise
        signum = signals.received
        if run is not None:
            print(f"\nInterrupted ({signal_name(signum, error)}): MLflow run {run.run_id} ({redact_text(run.name)}) "
                  "marked KILLED", file=sys.stderr, flush=True)
        code = exit_code(signum) if signum is not None else 130 if isinstance(error, KeyboardInterrupt) else 143
        raise SystemExit(code) from None
    with signals.held():  # a signal now waits until the run is marked
        run.finish("FINISHED")


def log_evaluation(client: TrackingClient, trained: TrainedRun, settings: EvalSettings, result: EvalResult,
                   folder: Path, signals: Signals | None = None) -> str:
    """An evaluation run nested under the evaluated run, holding metrics (with the curves
    ``eval/acc_by_length`` and ``eval/exact_by_length``, stepped by bucket upper length), tables and
    figures."""
    lo, hi = settings.lengths
    name = f"eval {trained.name} @ {lo}-{hi}" + (f" beam {settings.beam_size}" if settings.beam_size > 1 else "") \
        + (f" α {settings.length_penalty:g}" if settings.beam_size > 1 and settings.length_penalty else "") \
        + (f" {settings.n_best}-best" if settings.n_best > 1 else "")
    create = partial(client.create_run, trained.run.info.experiment_id, name,
                     {tags.KIND: tags.EVALUATION, tags.EVALUATED_RUN: trained.run_id}, parent_run_id=trained.run_id)
    with recorded(create, signals) as run:
        device = next(trained.model.parameters()).device
        run.log_params({**runtime_params(device), **{f"eval.{key}": value for key, value in vars(settings).items()},
                        "eval.model": trained.model_name, **result.signatures})
        run.log_metrics(result.metrics)
        log_length_curves(run, "eval", result.bucket_rows)
        for path in write_bucket_files(result.bucket_rows, folder):
            run.log_file(path, paths.EVAL_TABLES)
        if result.n_best:
            run.log_file(write_n_best_file(result.n_best, folder), paths.EVAL_TABLES)
        figure = accuracy_vs_length(
            {"token accuracy": result.bucket_rows,
             "exact match": [{**r, "acc": r["exact_match"]} for r in result.bucket_rows]},
            trained.train_lengths, f"{trained.name}: evaluation at lengths {lo}-{hi}",
        )
        log_figure(run, figure, folder, paths.LENGTH_FIGURE)
        if result.counterfactual:
            curves = {f"{mode}: flip rate": [{**r, "acc": r[f"cf_{mode}_flip_rate"]} for r in result.bucket_rows]
                      for mode in result.counterfactual}
            curves.update({f"{mode}: total variation": [{**r, "acc": r[f"cf_{mode}_tv"]} for r in result.bucket_rows]
                           for mode in result.counterfactual})
            figure = accuracy_vs_length(curves, trained.train_lengths,
                                        f"{trained.name}: how much the output moves when attention is replaced",
                                        ylabel="flip rate / total variation")
            log_figure(run, figure, folder, paths.COUNTERFACTUAL_FIGURE)
        if result.explorer:
            note = (f"Evaluation of {trained.name} at source lengths {lo}-{hi}: examples spread over the lengths, "
                    "decoded greedily")
            local = folder / paths.file_name(paths.EXPLORER)
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(explorer_html(f"Attention explorer: {trained.name}", [
                {"label": "the evaluated model", "samples": result.explorer}], note), encoding="utf-8")
            run.log_file(local, paths.folder(paths.EXPLORER))
        for i, (example, decoded) in enumerate(result.long_samples):
            out_tokens = trained.tgt_vocab.decode(decoded.tokens.tolist())
            weights = decoded.attention[:, :, : len(example.src)].float().numpy()  # (H, T_out, T_src)
            title = f"{trained.name}: source length {len(example.src)}"
            image = figure_to_array(attention_heatmap(weights, example.src, out_tokens, title, gold=example.alignment,
                                                      head_labels=trained.model.decoder.head_labels(len(weights))))
            run.log_image(image, paths.long_heatmap(i, len(example.src)))
            log_self_attention(run, trained, example, decoded, title, paths.long_heatmap(i, len(example.src)))
        for i, (text, example, decoded) in enumerate(result.sentence_samples):
            out_tokens = trained.tgt_vocab.decode(decoded.tokens.tolist())
            weights = decoded.attention[:, :, : len(example.src)].float().numpy()  # (H, T_out, T_src)
            output = output_text(decoded.tokens.tolist(), trained.tgt_vocab, trained.tgt_tokenizer)
            title = f"{trained.name}: {text!r} → {output!r}"
            figure = attention_heatmap(weights, example.src, out_tokens, title,
                                       head_labels=trained.model.decoder.head_labels(len(weights)))
            run.log_image(figure_to_array(figure), paths.sentence_heatmap(i))
            log_self_attention(run, trained, example, decoded, title, paths.sentence_heatmap(i))
    return run.run_id


def log_self_attention(run: TrackedRun, trained: TrainedRun, example, decoded, title: str, heatmap: str) -> None:
    """The self-attention figures of the sample whose heatmap is ``heatmap`` (a Transformer encoder's or
    decoder's; none for RNNs), beside it: ``paths.self_attention_beside``."""
    maps = self_attention_of(trained, example, decoded)
    out_tokens = trained.tgt_vocab.decode(decoded.tokens.tolist())
    for stack, figure in self_attention_heatmaps(maps, example.src, out_tokens, title, BOS_TOKEN).items():
        run.log_image(figure_to_array(figure), paths.self_attention_beside(stack, heatmap))


def log_figure(run: TrackedRun, figure, folder: Path, artifact: str) -> None:
    """Save the figure in the local output folder too, then upload it to ``artifact``."""
    local = folder / paths.file_name(artifact)
    save_figure(figure, local)
    run.log_file(local, paths.folder(artifact))


GROUPS_PARAM = "comparison.groups"
"""The comparison run's param listing its groups and their seed counts."""


def log_comparison(client: TrackingClient, groups: list[SeedGroup], out_dir: Path, parent: str | None,
                   signals: Signals | None = None, bootstrap: tuple[int, int] = (1000, 12345)) -> str:
    """A comparison run holding every table and figure, each group's mean of every overall ``eval/``
    metric (``eval/acc/scorer_dot``) and, over several seeds, its interval half-width
    (``eval/acc_ci95/scorer_dot``), and the heatmaps of one long source sequence as every run attended
    to it, side by side, where the runs evaluated a sequence in common; and the significance of each
    pair of groups' differences (``bootstrap``: resamples and seed; ``attnseq.evaluation.significance``)."""
    runs = [member.trained for group in groups for member in group.members]
    written = write_comparison(groups, out_dir, title=f"{len(runs)} runs")
    written |= write_significance(groups, out_dir, *bootstrap, title=f"{len(runs)} runs")
    create = partial(
        client.create_run, runs[0].run.info.experiment_id, f"comparison of {len(runs)} runs in {len(groups)} groups",
        {tags.KIND: tags.COMPARISON, tags.COMPARED_RUNS: ",".join(t.run_id for t in runs)}, parent_run_id=parent)
    with recorded(create, signals) as run:
        run.log_params({GROUPS_PARAM: "; ".join(group.name for group in groups)})
        for path in written.values():
            run.log_file(path, paths.COMPARISON)
        members = [member for group in groups for member in group.members]
        shared = shared_long_sample(members)
        if shared is not None:
            log_side_by_side(run, out_dir, paths.SAME_SAMPLE_HEATMAPS, *shared, same_sample_title(shared[0]))
        log_comparison_explorer(run, out_dir, members)
        for i, (text, example, side_panels) in enumerate(same_sentences(groups)):
            log_side_by_side(run, out_dir, paths.comparison_sentence_heatmaps(i), example, side_panels,
                             sentence_title(text))
        metrics = {}
        for group in groups:
            for key, interval in group.overall().items():
                if interval is None or not key.startswith("eval/"):
                    continue
                metrics[f"{key}/{metric_label(group.label)}"] = interval.mean
                if interval.half_width is not None:
                    metrics[f"{key}{HALF_WIDTH}/{metric_label(group.label)}"] = interval.half_width
        run.log_metrics(metrics)
    return run.run_id


def comparison_explorer(members: list[Compared]) -> str | None:
    """The comparison's attention explorer: the first attending run's explorer examples as every attending run
    attends to them, teacher-forced with each reference (``reference_attention``); None with fewer than two."""
    attending = [member for member in members if member.result.explorer_examples]
    if len(attending) < 2:
        return None
    examples = attending[0].result.explorer_examples
    forced = [reference_attention(m.trained.model, examples, m.trained.src_vocab, m.trained.tgt_vocab)
              for m in attending]
    samples = [{"label": f"example {k + 1}", "source": list(example.src), "rows": [*example.tgt, EOS_TOKEN],
                "gold": None if example.alignment is None else [*example.alignment, -1],
                "attention": [by_run[k].tolist() for by_run in forced]} for k, example in enumerate(examples)]
    names = [m.trained.name for m in attending]
    return comparison_explorer_html(f"Attention explorer: {len(names)} runs compared", names, samples,
                                    f"the evaluation examples of {names[0]}, as each attending run attends to them")


def log_comparison_explorer(run: TrackedRun, out_dir: Path, members: list[Compared]) -> None:
    """``comparison_explorer``, written in ``out_dir`` and stored at ``paths.COMPARISON_EXPLORER``."""
    page = comparison_explorer(members)
    if page is not None:
        local = out_dir / paths.file_name(paths.COMPARISON_EXPLORER)
        local.write_text(page, encoding="utf-8")
        run.log_file(local, paths.folder(paths.COMPARISON_EXPLORER))


SidePanels = list[tuple[str, TrainedRun, Decoded]]
"""One sample as each run decoded it: the run's panel label, the run, its decoding of the sample."""


def shared_long_sample(members: list[Compared]) -> tuple[Example, SidePanels] | None:
    """The longest source sequence among every attending run's heatmap samples, with each attending run's
    decoding of it (labelled by run name); None when fewer than two runs attend or they share no sample
    (different evaluation lengths)."""
    attending = [member for member in members if member.result.long_samples]
    if len(attending) < 2:
        return None
    samples = [{tuple(example.src): (example, decoded) for example, decoded in member.result.long_samples}
               for member in attending]
    common = set(samples[0]).intersection(*samples[1:])
    if not common:
        return None
    source = max(common, key=lambda src: (len(src), src))
    return samples[0][source][0], [(member.trained.name, member.trained, by_source[source][1])
                                   for member, by_source in zip(attending, samples)]


def same_sample_title(example: Example) -> str:
    return f"source length {len(example.src)}, as each run attends to it"


def log_side_by_side(run: TrackedRun, out_dir: Path, artifact: str, example: Example, runs: SidePanels,
                     title: str) -> None:
    """One sample's cross-attention as each run attended to it (``artifact``), and the self-attention of the
    runs that self-attend beside it (``paths.self_attention_beside``)."""
    log_figure(run, cross_attention_side_by_side(example, runs, title), out_dir, artifact)
    for stack, figure in self_attention_side_by_side(example, runs, title).items():
        log_figure(run, figure, out_dir, paths.self_attention_beside(stack, artifact))


def same_sample_figure(members: list[Compared]) -> Figure | None:
    """``shared_long_sample``'s cross-attention, one panel per run; None without one."""
    shared = shared_long_sample(members)
    if shared is None:
        return None
    return cross_attention_side_by_side(*shared, same_sample_title(shared[0]))


def cross_attention_side_by_side(example: Example, runs: SidePanels, title: str) -> Figure:
    """The sample's cross-attention as each run attended to it, a panel per run (``same_sample_heatmaps``),
    its gold positions marked where the sample has them."""
    panels = [(label, decoded.attention[:, :, : len(example.src)].float().numpy(),  # (H, T_out, T_src)
               trained.tgt_vocab.decode(decoded.tokens.tolist())) for label, trained, decoded in runs]
    return same_sample_heatmaps(panels, example.src, title, gold=example.alignment)


def self_attention_side_by_side(example: Example, runs: SidePanels, title: str) -> dict[str, Figure]:
    """The self-attention of the sample each run decoded, a figure per stack (``encoder``, ``decoder``) that
    any of the runs self-attends with, a column per such run (``same_sample_self_attention``); the runs
    without that stack's self-attention are named in its title. Empty when no run self-attends."""
    found = [(label, trained, decoded, self_attention_of(trained, example, decoded))
             for label, trained, decoded in runs]
    figures = {}
    for stack in ("encoder", "decoder"):
        drawn = [(label, maps[stack], trained.tgt_vocab.decode(decoded.tokens.tolist()))
                 for label, trained, decoded, maps in found if stack in maps]
        if drawn:
            left_out = [label for label, _, _, maps in found if stack not in maps]
            figures[stack] = same_sample_self_attention(stack, drawn, example.src, title, BOS_TOKEN, left_out)
    return figures


def same_sentences(groups: list[SeedGroup]) -> list[tuple[str, Example, SidePanels]]:
    """Each ``eval.sentences`` text that several attending runs read and translated, with each one's decoding,
    labelled by its group (and seed, in a group of several): the runs that read it into the same tokens as
    the first (runs of one corpus share their tokenizer)."""
    attending = [(group.name if len(group.members) == 1 else f"{group.name}, seed {member.seed}", member)
                 for group in groups for member in group.members if member.result.sentence_samples]
    if len(attending) < 2:
        return []
    shared = []
    for i, (text, example, _) in enumerate(attending[0][1].result.sentence_samples):
        runs = [(label, member.trained, member.result.sentence_samples[i][2]) for label, member in attending
                if i < len(member.result.sentence_samples) and member.result.sentence_samples[i][0] == text
                and member.result.sentence_samples[i][1].src == example.src]
        if len(runs) > 1:
            shared.append((text, example, runs))
    return shared


def same_sentence_figures(groups: list[SeedGroup]) -> list[Figure]:
    """For each of ``same_sentences``, its attention as every attending run read and translated it, one panel
    per run."""
    return [cross_attention_side_by_side(example, runs, sentence_title(text))
            for text, example, runs in same_sentences(groups)]


def sentence_title(text: str) -> str:
    return f"{text!r}, as each run attends to it"


def evaluate(cfg: DictConfig, signals: Signals | None = None) -> list[EvalResult]:
    """Evaluate the runs ``cfg`` (a composed ``conf/evaluate.yaml``) selects; their results, in order.
    ``signals``: the entry point's (its runtime's); without them, nothing process-wide changes."""
    return evaluate_config(check_config(cfg), signals)


def evaluate_config(cfg: EvalConfig, signals: Signals | None = None) -> list[EvalResult]:
    signals = signals or Signals()  # not installed: it never sees a signal
    check_store_to_read(cfg.mlflow.tracking_uri)  # threads: the entry point's runtime sets them
    client = TrackingClient(cfg.mlflow.tracking_uri)
    runs, parent = chosen_runs(client, cfg)
    out_dir = Path(cfg.paths.output_dir)
    trained_runs, results = [], []
    bars = sys.stdout.isatty()  # piped into a file: a line per run instead of bars' carriage-return frames
    for number, run in enumerate(tqdm(runs, desc="evaluating runs", unit="run", disable=len(runs) == 1 or not bars,
                                      file=sys.stdout), start=1):
        trained = load_trained_run(client, run, cfg.model)
        settings = settings_for(cfg, trained)
        started = time.monotonic()
        if not bars:
            probed = (f", the faithfulness measures on {settings.faith.samples} of them (the slow part)"
                      if settings.faith.samples and trained.model.attention is not None else "")  # none: no probe
            print(redact_text(f"[{number}/{len(runs)}] {trained.name}: decoding {settings.size:,} sequences at "
                              f"lengths {settings.lengths[0]}-{settings.lengths[1]}{probed} ..."), flush=True)
        # one bar per run, over the sequences it decodes (below the runs' bar, gone once the run is done)
        with tqdm(total=settings.size, desc=redact_text(trained.name), unit="seq", leave=False, disable=not bars,
                  position=0 if len(runs) == 1 else 1, file=sys.stdout) as decoding:
            result = evaluate_run(trained, settings, progress=decoding.update)
        eval_run = log_evaluation(client, trained, settings, result, out_dir / trained.run_id, signals)
        m = result.metrics
        url = ui_links(cfg.mlflow.tracking_uri, run.info.experiment_id, eval_run).url
        took = time.monotonic() - started
        line = (f"{trained.name}: eval acc {m['eval/acc']:.3f}, exact {m['eval/exact_match']:.3f} at lengths "
                f"{settings.lengths[0]}-{settings.lengths[1]} ({took:.0f} s); evaluation run {url}")
        tqdm.write(redact_text(line), file=sys.stdout)
        trained_runs.append(trained)
        results.append(result)
    if len(results) > 1 and cfg.compare:
        groups = group_runs(trained_runs, results)
        if len(groups) > 1:
            pairs = len(groups) * (len(groups) - 1) // 2
            print(f"Comparing {len(groups)} groups: the paired bootstrap over {pairs} pair{'s' if pairs > 1 else ''} "
                  f"of groups, {cfg.eval.bootstrap_samples:,} resamples each ...", flush=True)
        comparison = log_comparison(client, groups, out_dir / "comparison", parent=parent, signals=signals,
                                    bootstrap=(cfg.eval.bootstrap_samples, cfg.eval.bootstrap_seed))
        header, rows = table_rows(groups)
        url = ui_links(cfg.mlflow.tracking_uri, runs[0].info.experiment_id, comparison).url
        print(redact_text(f"\n{markdown_table(header, rows)}\n{INTERVAL_NOTE}\nComparison run {url}; "
                          f"figures and tables (per group, per run, attention diagnostics) in "
                          f"{out_dir / 'comparison'}"), flush=True)
    links = ui_links(cfg.mlflow.tracking_uri, runs[0].info.experiment_id)
    if links.open_with:
        print(f"Open it with: {links.open_with}", flush=True)
    return results
