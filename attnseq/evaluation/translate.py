"""``translate``: a trained run's model answering sources given on the command line or stdin
(``translate.py``), as its MLflow model answers them, in seconds.

The run is rebuilt from its own artifacts (``trained_runs``, as evaluation does: no MLflow model
loaded, no Lightning imported) and its sources go through the served model's ``Translator``
(``attnseq.serving.predictor``): the same tokenizer, decode limits and request limits, so a source
it refuses (empty, an unknown token, more tokens than ``RequestLimits.max_source_tokens``) is refused
with the served model's message. A source longer than the run's training lengths is decoded, with a
warning: past them a model often stops early or repeats itself. With ``n_best`` > 1 each source's n
best outputs of the beam come with their ranking scores (``Translator.translate_n_best``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from attnseq.config import TranslateConfig
from attnseq.data.vocab import BOS_TOKEN
from attnseq.errors import ConfigError
from attnseq.evaluation.trained_runs import TrainedRun, get_run, latest_training_run, load_trained_run
from attnseq.serving.predictor import DecodeLimit, Hypothesis, Translator, quoted
from attnseq.tracking import paths
from attnseq.tracking.client import TrackingClient
from attnseq.tracking.store import check_store_to_read

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LONGER_THAN_TRAINING = "longer than the run's training lengths"
"""What the warning about a source past the training lengths says (tests look for it)."""
LATEST = "latest"


@dataclass
class Translation:
    trained: TrainedRun
    outputs: list[str]  # one per source, in order
    warnings: list[str] = field(default_factory=list)  # one line each
    heatmaps: list[Path] = field(default_factory=list)  # the files written: each source's, its self-attention's
    n_best: list[list[Hypothesis]] = field(default_factory=list)  # with cfg.n_best > 1: each source's, best first


def translate(cfg: TranslateConfig, sources: Sequence[str]) -> Translation:
    """Each source's output by the model of run ``cfg.run_id``, greedy or with a beam of ``cfg.beam_size``
    (with ``cfg.n_best`` > 1 its n best too), and with ``cfg.heatmaps`` each source's attention heatmap
    (of its best output) written as a PNG, and a self-attending model's self-attention beside it
    (``self_attention_paths``)."""
    if not sources:
        raise ConfigError("no sources to translate.",
                          'give them on the command line (python translate.py run_id=<id> "s3 s1 s4"), '
                          "or one per line on stdin.")
    heatmap_files = heatmap_paths(cfg.heatmaps, len(sources))
    trained = load_run(cfg)
    if heatmap_files and trained.model.attention is None:
        raise ConfigError(f"heatmaps={cfg.heatmaps}: run {trained.run_id} ({trained.name}) was trained without "
                          "attention (scorer=none), so it has no attention to draw.", "drop heatmaps=.")
    translator = Translator(trained.model, trained.src_vocab, trained.tgt_vocab, trained.src_tokenizer,
                            trained.tgt_tokenizer, DecodeLimit.of_config(trained.config))
    encoded = translator.encode(sources)  # the served model's checks: InvalidSource, exit 2
    n_best = (translator.translate_n_best(sources, cfg.beam_size, cfg.n_best, cfg.length_penalty) if cfg.n_best > 1
              else [])
    outputs = ([best[0].output for best in n_best] if n_best
               else translator.translate(sources, cfg.beam_size, cfg.length_penalty))
    translation = Translation(trained, outputs, warnings=length_warnings(trained, encoded), n_best=n_best)
    for row, (ids, path) in enumerate(zip(encoded, heatmap_files)):
        translation.heatmaps += write_heatmap(translator, trained, sources[row], ids, outputs[row], cfg, path)
    return translation


def load_run(cfg: TranslateConfig) -> TrainedRun:
    """The run ``cfg.run_id`` names (``latest``: the newest finished training run), rebuilt; a
    ``ConfigError`` for a store, run or model that is not there."""
    if cfg.experiment_name and cfg.run_id != LATEST:
        raise ConfigError(f"experiment_name={cfg.experiment_name} chooses among an experiment's runs, but "
                          f"run_id={cfg.run_id} names one already.",
                          "drop experiment_name, or pass run_id=latest for that experiment's newest run.")
    uri = cfg.mlflow.tracking_uri
    check_store_to_read(uri)
    client = TrackingClient(uri)
    run = (latest_training_run(client, cfg.experiment_name) if cfg.run_id == LATEST
           else get_run(client, cfg.run_id))
    return load_trained_run(client, run)


def heatmap_paths(target: str | None, count: int) -> list[Path]:
    """Where each source's heatmap goes: ``<folder>/source_<n>.png``, or the one ``.png`` file named."""
    if target is None:
        return []
    path = Path(target)
    if path.suffix.lower() == ".png":
        if count != 1:
            raise ConfigError(f"heatmaps={target} names one file, but there are {count} sources.",
                              f"name a folder instead: heatmaps={path.with_suffix('')}/ (source_<n>.png in it).")
        return [path]
    return [path / f"source_{row}.png" for row in range(count)]


def self_attention_paths(heatmap: Path, stacks: Sequence[str]) -> dict[str, Path]:
    """Where a source's self-attention figures go, by stack (``encoder``, ``decoder``): beside its heatmap
    ``<folder>/source_<n>.png`` as ``<folder>/self_attention/<stack>_source_<n>.png``, the rule evaluation's
    and the comparison's figures follow (``paths.self_attention_beside``)."""
    return {stack: Path(paths.self_attention_beside(stack, heatmap.as_posix())) for stack in stacks}


def length_warnings(trained: TrainedRun, encoded: Sequence[Sequence[int]]) -> list[str]:
    """One line when any source is longer than the run's longest training source."""
    lo, hi = trained.train_lengths
    longer = [(row, len(ids)) for row, ids in enumerate(encoded) if len(ids) > hi]
    if not longer:
        return []
    shown = ", ".join(f"source {row}: {n} tokens" for row, n in longer[:3]) + (" …" if len(longer) > 3 else "")
    return [f"warning: {len(longer)} source(s) {LONGER_THAN_TRAINING} {lo}-{hi} ({shown}); past them its outputs "
            "are often cut short or wrong."]


def write_heatmap(translator: Translator, trained: TrainedRun, text: str, ids: list[int], output: str,
                  cfg: TranslateConfig, path: Path) -> list[Path]:
    """``heatmap_figures``, saved: the files written."""
    from attnseq.tracking.plots import save_figure  # matplotlib: only when asked for

    figures = heatmap_figures(translator, trained, text, ids, output, cfg, path)
    for target, figure in figures.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        save_figure(figure, target)
    return list(figures)


def heatmap_figures(translator: Translator, trained: TrainedRun, text: str, ids: list[int], output: str,
                    cfg: TranslateConfig, path: Path) -> dict[Path, Figure]:
    """The source's attention as it was decoded alone, drawn as evaluation draws a named sentence's, for
    ``path``; a self-attending model's self-attention of the same decoding (a layer × head grid per stack,
    as evaluation and training draw it) for ``self_attention_paths``: the figures by the file each goes to."""
    from attnseq.tracking.plots import attention_heatmap, self_attention_heatmaps  # matplotlib: only when asked for

    decoded = translator.decode_batch(torch.tensor([ids]), cfg.beam_size, cfg.length_penalty,  # (1, T_src)
                                      keep_attention=True)
    n = int(decoded.lengths[0])
    weights = decoded.attention[0, :, :n].float().numpy()  # (H, T_out, T_src)
    src_tokens, out_tokens = trained.src_vocab.decode(ids), trained.tgt_vocab.decode(decoded.tokens[0, :n].tolist())
    title = f"{trained.name}: {quoted(text)} → {quoted(output)}"
    figures = {path: attention_heatmap(weights, src_tokens, out_tokens, title,
                                       head_labels=trained.model.decoder.head_labels(len(weights)))}
    maps = trained.model.sequence_self_attention(torch.tensor(ids), decoded.tokens[0, :n])  # {} for an RNN
    drawn = self_attention_heatmaps(maps, src_tokens, out_tokens, title, BOS_TOKEN)
    beside = self_attention_paths(path, list(drawn))
    return figures | {beside[stack]: figure for stack, figure in drawn.items()}
