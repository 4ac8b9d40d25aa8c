"""``RunArtifacts``: everything a training run writes to MLflow besides scalar metrics (the
paths are ``attnseq.tracking.paths``).

- at start: the resolved config, the vocabularies (and a subword run's tokenizers), the model
  summary and its parameter count, and for text tasks the signatures of the sacreBLEU, chrF and TER
  scores the validation logs (params ``sacrebleu.signature``, ``chrf.signature``, ``ter.signature``);
- before training (step 0; drawn after the first step, from a copy of the untrained model) and
  every validation epoch: attention heatmaps of a fixed set of
  validation samples (short, medium, longer than training; a Transformer encoder's and decoder's
  self-attention of the same samples beside them, ``self_attention/``), and every validation epoch the
  accuracy-vs-length figure, as time-stepped images whose step
  is the step Lightning logs the validation metrics at (``steps.StepAtBatchStart``), so the UI's image slider and
  metric charts share one axis (Lightning's ``epoch`` metric maps steps to epochs), and the
  per-bucket table, appended;
- every time Lightning has written ``last.ckpt`` (``UploadedCheckpoint``, after the write, so the
  run's copy is never an epoch behind): that checkpoint, so ``resume=`` works from another machine;
- at the end of training: the last validation's curves ``val/acc_by_length`` and
  ``val/exact_by_length`` (``attnseq.tracking.length_curves``: step = a bucket's upper length);
- at the end: the attention explorer (``paths.EXPLORER``, ``attnseq.tracking.explorer``): the heatmap samples'
  attention at each epoch their heatmaps were logged (at most ``EXPLORER_EPOCHS``, evenly thinned) and, of the
  final model, the importance measures and self-attention beside it;
- at the end: the accuracy-vs-length figure, the heatmaps of the last epoch's model and of the best
  checkpoint as plain files (``attention/long.png``, ``attention/best_long.png``: found in the
  Artifacts tab without the slider), the best and last checkpoints, a portable
  model file (config + weights, loadable with ``torch.load(weights_only=True)``), and the same
  model as an MLflow model (``attnseq.serving``: ``runs:/<run id>/model``); with ``average.k``, the
  averaged checkpoints' model beside it the same way (``paths.AVERAGED_MODEL_FILE``,
  ``runs:/<run id>/averaged_model``: ``attnseq.training.averaging``).

The plain-file figures (the accuracy-vs-length figure, the last epoch's and the best checkpoint's
heatmaps) are written into the run's folder first, beside its checkpoints (``<output_dir>/figures/``,
``<output_dir>/attention/``: found without the UI), and that same file is what the run stores.

The run's note (its description on the run page) says what the run is and where these pictures are.
All of it happens on rank 0 only, and never inside a training step.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from attnseq.data import Example, collate
from attnseq.data.datamodule import Seq2SeqDataModule
from attnseq.data.tasks import TEXT_TASKS
from attnseq.data.tokenizers import SubwordTokenizer
from attnseq.data.vocab import BOS_TOKEN, EOS
from attnseq.faithfulness.explorer import explorer_samples
from attnseq.faithfulness.importance import DEFAULTS as IMPORTANCE_DEFAULTS
from attnseq.lifecycle.signals import Signals
from attnseq.metrics.faithfulness import ImportanceSettings
from attnseq.metrics.translation import signature_params
from attnseq.model import Seq2Seq, decode_length_limit, decoder_inputs, greedy_decode
from attnseq.model.encoders import RNN
from attnseq.serving.predictor import RequestLimits
from attnseq.tracking import paths, tags
from attnseq.tracking.explorer import explorer_html
from attnseq.tracking.length_curves import log_length_curves
from attnseq.tracking.logged_model import log_translator
from attnseq.tracking.plots import (
    accuracy_vs_length,
    attention_heatmap,
    figure_to_array,
    self_attention_heatmaps,
    write_png,
)
from attnseq.tracking.redaction import redact_document
from attnseq.tracking.run import TrackedRun
from attnseq.tracking.store import ui_route
from attnseq.training.lit_module import Seq2SeqLitModule
from attnseq.training.steps import StepAtBatchStart

if TYPE_CHECKING:
    from attnseq.training.averaging import CheckpointAverage


def pick_heatmap_samples(
    examples: list[Example], train_lengths: tuple[int, int], count: int = 3
) -> dict[str, Example]:
    """A fixed, deterministic choice: short, medium and the longest evaluated (beyond training
    where the evaluation lengths reach past it)."""
    lo, hi = train_lengths
    longest = max(len(e.src) for e in examples)
    targets = {"short": lo + (hi - lo) // 4, "medium": (lo + hi) // 2 + 1, "long": longest}
    if longest <= hi:
        targets["long"] = hi
    # min() keeps the first of equally close examples, so the choice is stable across epochs
    return {
        label: min(examples, key=lambda e: abs(len(e.src) - target))
        for label, target in list(targets.items())[:count]
    }


EXPLORER_EPOCHS = 20
"""At most this many epochs' attention in a training run's explorer (the first, the last, evenly between)."""


def thinned(items: list, most: int) -> list:
    """At most ``most`` of ``items``, the first and the last kept, the rest evenly spaced between."""
    if len(items) <= most:
        return items
    return [items[round(k * (len(items) - 1) / (most - 1))] for k in range(most)]


MODEL_INPUT_EXAMPLES = 2
"""Validation sources stored as the MLflow model's input example."""


def heatmap_title(label: str, source_length: int, when: str, correct: bool) -> str:
    """A heatmap's title: which sample, when, and the verdict on its decoded output."""
    return f"{label} sample (source length {source_length}), {when}: {'correct' if correct else 'wrong'}"


def epochs(count: int) -> str:
    return f"{count} epoch{'' if count == 1 else 's'}"


def run_note(data: Seq2SeqDataModule, module: Seq2SeqLitModule, heatmap_labels: list[str],
             link: Callable[[str], str] | None = None) -> str:
    """The run's description (MLflow's note, Markdown) in two lines: what was trained, and where its
    pictures are; with ``link`` (an artifact's path -> its UI route, ``attnseq.tracking.store.ui_route``)
    each picture's name is a link that opens it, one click from the run page's first screen."""

    def named(artifact: str) -> str:  # a link as plain text: MLflow folds a description over 100 px behind
        return f"[{artifact}]({link(artifact)})" if link else f"`{artifact}`"  # "Show more"; code is taller

    model = module.model.config
    heads = f"{model.heads} head{'s' if model.heads > 1 else ''}"
    lo, hi = module.train_lengths
    recurrent = model.encoder == RNN  # a Transformer encoder has no cell to name
    what = (f"Training run: {data.task} task, {model.encoder} encoder{f' ({model.cell})' if recurrent else ''}, "
            f"{model.scorer} attention ({heads}), {model.decoder} decoder, {module.model.num_parameters():,} "
            f"parameters, trained on source lengths {lo}-{hi}.")
    pictures = [paths.heatmap_file(label) for label in heatmap_labels] + [paths.LENGTH_FIGURE]
    opened = "a click opens one; all in the Artifacts tab" if link else "Artifacts tab"
    where = f"Pictures ({opened}, at the end of training): {', '.join(named(p) for p in pictures)}"
    if heatmap_labels:
        where += f"; the best checkpoint's heatmaps: {named(paths.best_heatmap_file(heatmap_labels[0]))}, ..."
        stacks = [stack for stack, attends in zip(("encoder", "decoder"), model.self_attending) if attends]
        if stacks:  # one figure named (the decoder's, if it has one), the others beside it: a short note
            where += (f"; self-attention (a row per layer): "
                      f"{named(paths.self_attention_file(stacks[-1], heatmap_labels[0]))}, ...")
        where += f"; every epoch's: Model metrics, `{paths.attention_image(heatmap_labels[0])}` (slider)"
        where += f"; hover, pick a head, compare with other importance measures: {named(paths.EXPLORER)}"
    return f"{what}\n\n{where}."


def length_curves_of(rows: list[dict]) -> dict[str, list[dict]]:
    """The two curves of an accuracy-vs-length figure, from bucket rows: token accuracy, exact match."""
    return {"token accuracy": rows, "exact match": [{**r, "acc": r["exact_match"]} for r in rows]}


def vocabulary_files(data: Seq2SeqDataModule) -> dict[str, str]:
    """The JSON of the run's vocabularies and, where learned (bpe, unigram), tokenizers, by artifact path."""
    files = {paths.SRC_VOCAB: data.src_vocab.to_json(), paths.TGT_VOCAB: data.tgt_vocab.to_json()}
    for artifact, tokenizer in ((paths.SRC_TOKENIZER, data.src_tokenizer), (paths.TGT_TOKENIZER, data.tgt_tokenizer)):
        if isinstance(tokenizer, SubwordTokenizer):
            files[artifact] = tokenizer.to_json()
    return files


class RunArtifacts(StepAtBatchStart):
    def __init__(
        self,
        run: TrackedRun,
        signals: Signals,
        resolved_config: str,
        best: ModelCheckpoint,
        last: ModelCheckpoint,
        heatmap_samples: int = 3,
        heatmap_every_n_epochs: int = 1,
        folder: Path | None = None,
        averaging: CheckpointAverage | None = None,
        importance: ImportanceSettings = IMPORTANCE_DEFAULTS,
    ) -> None:
        self.run = run
        self.importance = importance  # the explorer's importance measures (faith.measures, ig_steps, ...)
        self.explorer_epochs: list[dict] = []  # per logged epoch: the samples' attention (explorer_samples)
        self.averaging = averaging  # average.k: its averaged model is logged beside the run's own
        self.folder = folder  # the run's output folder: its plain-file figures are also written there
        self.signals = signals
        self.resolved_config = resolved_config
        self.best = best
        self.last = last
        self.heatmap_samples = heatmap_samples
        self.heatmap_every_n_epochs = heatmap_every_n_epochs
        self.samples: dict[str, Example] = {}
        self.untrained: Seq2Seq | None = None  # the model before its first step, until its heatmaps are drawn
        self.heatmap_epoch: int | None = None  # the epoch whose heatmaps were drawn last: once an epoch
        self.best_checkpoint: dict | None = None  # the best checkpoint as read at the end (``read_best``), once

    # -- start ---------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule) -> None:
        if not trainer.is_global_zero:
            return
        data = trainer.datamodule
        self.run.log_text(self.resolved_config, paths.RESOLVED_CONFIG)
        for artifact, text in vocabulary_files(data).items():
            self.run.log_text(text, artifact)
        self.run.log_text(str(pl_module.model), paths.MODEL_SUMMARY)
        self.run.log_params({"model.num_parameters": pl_module.model.num_parameters()})
        if data.task in TEXT_TASKS:
            self.run.log_params(signature_params())
        if self.heatmap_samples and pl_module.model.attention is not None:
            self.samples = pick_heatmap_samples(data.val_examples, pl_module.train_lengths, self.heatmap_samples)
        experiment_id, run_id = self.run.experiment_id(), self.run.run_id
        note = run_note(data, pl_module, list(self.samples), lambda path: ui_route(experiment_id, run_id, path))
        self.run.set_tags({tags.NOTE: note})

    # -- every epoch ---------------------------------------------------------------------
    def on_validation_end(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        self.log_untrained_heatmaps(trainer, pl_module)
        epoch, step = trainer.current_epoch + 1, self.metric_step  # counted from 1, as the terminal does
        rows = pl_module.last_bucket_tables.get("val", [])
        if rows:
            table = {key: [row[key] for row in rows] for key in rows[0]}
            table["epoch"] = [epoch] * len(rows)
            self.run.log_table(table, paths.BUCKET_TABLE)
            title = f"validation accuracy vs source length, epoch {epoch} (step {step})"
            figure = accuracy_vs_length(length_curves_of(rows), pl_module.train_lengths, title)
            self.run.log_image_step(figure_to_array(figure), paths.LENGTH_IMAGE, step)
        # the first epoch, then every n; once an epoch, at its first validation (trainer.val_check_interval < 1
        # validates more often: the heatmaps are drawn at the epochs asked for, not at every validation)
        if self.samples and (epoch - 1) % self.heatmap_every_n_epochs == 0 and epoch != self.heatmap_epoch:
            self.heatmap_epoch = epoch
            self.log_heatmaps(trainer, pl_module, f"epoch {epoch} (step {step})")

    def on_train_start(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule) -> None:
        """The heatmaps before any training, at step 0 (MLflow's image cards open on step 0), are of
        the untrained model: a copy of it is kept here and drawn after the first step, at the first
        validation's end, so that drawing does not delay the start of training."""
        super().on_train_start(trainer, pl_module)
        if self.samples and trainer.is_global_zero and trainer.global_step == 0:  # not on a resume
            self.untrained = copy.deepcopy(pl_module.model)

    def log_untrained_heatmaps(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule) -> None:
        if self.untrained is not None:
            untrained, self.untrained = self.untrained, None
            self.log_heatmaps(trainer, pl_module, "before training (step 0)", model=untrained, step=0)

    def log_heatmaps(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule, when: str,
                     model: Seq2Seq | None = None, step: int | None = None) -> None:
        """The samples' heatmaps, decoded by ``model`` (the module's own by default), as time-stepped
        images at ``step`` (``metric_step`` by default)."""
        step = self.metric_step if step is None else step
        heatmaps, self_attention = self.heatmap_images(trainer, pl_module, when, model)
        for label, image in heatmaps.items():
            self.run.log_image_step(image, paths.attention_image(label), step)
        for (stack, label), image in self_attention.items():
            self.run.log_image_step(image, paths.self_attention_image(stack, label), step)
        self.explorer_epochs.append({"label": when, "samples": self.explorer_entries(
            trainer, pl_module, pl_module.model if model is None else model, measures=False)})

    def explorer_entries(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule, model: Seq2Seq,
                         measures: bool) -> list[dict]:
        """The heatmap samples as ``model`` decodes them (``explorer_samples``; ``measures``: with importance)."""
        data = trainer.datamodule
        longest = torch.tensor([max(len(e.src) for e in self.samples.values())])  # (1,)
        limit = decode_length_limit(longest, pl_module.decode_ratio, pl_module.decode_extra)
        return explorer_samples(model, list(self.samples.values()), data.src_vocab, data.tgt_vocab, limit,
                                self.importance, labels=list(self.samples), measures=measures)

    def log_explorer(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule) -> None:
        """The attention explorer: every logged epoch's attention, then the final model's with importance."""
        final = {"label": f"after {epochs(trainer.current_epoch)} (with importance)",
                 "samples": self.explorer_entries(trainer, pl_module, pl_module.model, measures=True)}
        shown = thinned(self.explorer_epochs, EXPLORER_EPOCHS - 1) + [final]
        model = pl_module.model.config
        note = (f"Training run {self.run.name}: {trainer.datamodule.task} task, {model.encoder} encoder, "
                f"{model.scorer} attention, {model.decoder} decoder; greedy outputs of its validation heatmap samples")
        self.log_page(explorer_html(f"Attention explorer: {self.run.name}", shown, note), paths.EXPLORER)

    def log_page(self, text: str, artifact: str) -> None:
        """A text file written at ``artifact`` under the run's folder and stored at the same path."""
        if self.folder is None:
            self.run.log_text(text, artifact)
            return
        path = self.folder / artifact
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        self.run.log_file(path, paths.folder(artifact))

    @torch.no_grad()
    def heatmap_images(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule, when: str, model: Seq2Seq | None = None,
                       ) -> tuple[dict[str, np.ndarray], dict[tuple[str, str], np.ndarray]]:
        """Each sample's heatmap as decoded by ``model`` (the module's own by default), by label, and its
        self-attention figures (a Transformer encoder's or decoder's; ``Seq2Seq.self_attention``) by
        ``(stack, label)``."""
        data = trainer.datamodule
        model = pl_module.model if model is None else model
        batch = collate(data.encode_examples(list(self.samples.values()))).to(pl_module.device)
        was_training = model.training
        model.eval()
        limit = decode_length_limit(batch.src_lengths, pl_module.decode_ratio, pl_module.decode_extra)
        decoded = greedy_decode(model, batch.src, batch.src_lengths, max_length=limit)
        self_attention = model.self_attention(batch.src, batch.src_lengths, decoder_inputs(decoded.tokens))
        model.train(was_training)
        images, self_images = {}, {}
        for i, (label, example) in enumerate(self.samples.items()):
            n_src, n_out = len(example.src), int(decoded.lengths[i])
            out_ids = decoded.tokens[i, :n_out].tolist()
            out_tokens = data.tgt_vocab.decode(out_ids)
            weights = decoded.attention[i, :, :n_out, :n_src].float().cpu().numpy()  # (H, T_out, T_src)
            correct = out_ids[:-1] == data.tgt_vocab.encode(example.tgt) and out_ids[-1:] == [EOS]
            title = heatmap_title(label, n_src, when, correct)
            figure = attention_heatmap(weights, example.src, out_tokens, title, gold=example.alignment,
                                       head_labels=model.decoder.head_labels(weights.shape[0]))
            images[label] = figure_to_array(figure)
            maps = self_attention.of_row(i, n_src, n_out)
            for stack, figure in self_attention_heatmaps(maps, example.src, out_tokens, title, BOS_TOKEN).items():
                self_images[stack, label] = figure_to_array(figure)
        return images, self_images

    def log_final_heatmaps(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule) -> None:
        """The last epoch's heatmaps and the best checkpoint's, as plain files in ``attention/`` (the
        self-attention figures in ``paths.SELF_ATTENTION_FOLDER``)."""
        self.log_heatmap_files(trainer, pl_module, f"after {epochs(trainer.current_epoch)}")
        checkpoint = self.read_best()
        if checkpoint is None:
            return
        model = copy.deepcopy(pl_module.model)
        model.load_state_dict(model_weights(checkpoint["state_dict"]))
        when = f"best checkpoint, after {epochs(checkpoint['epoch'] + 1)}"
        self.log_heatmap_files(trainer, pl_module, when, model=model)

    def log_heatmap_files(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule, when: str,
                          model: Seq2Seq | None = None) -> None:
        """The heatmaps of ``model`` (the best checkpoint's) or of the module's own, as plain files."""
        best = model is not None
        heatmaps, self_attention = self.heatmap_images(trainer, pl_module, when, model=model)
        for label, image in heatmaps.items():
            self.log_picture(image, paths.best_heatmap_file(label) if best else paths.heatmap_file(label))
        for (stack, label), image in self_attention.items():
            self.log_picture(image, paths.self_attention_file(stack, label, best=best))

    def log_picture(self, image: np.ndarray, artifact: str) -> None:
        """A figure as a plain file: written at ``artifact`` under the run's folder, beside its
        checkpoints, and that file stored in the run at the same path (without a folder: stored only)."""
        if self.folder is None:
            self.run.log_image(image, artifact)
            return
        path = self.folder / artifact
        path.parent.mkdir(parents=True, exist_ok=True)
        write_png(image, path)
        self.run.log_file(path, paths.folder(artifact))

    def on_train_end(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule) -> None:
        """The last validation's accuracy and exact match by length, as curves MLflow overlays."""
        if trainer.is_global_zero:
            self.log_untrained_heatmaps(trainer, pl_module)  # training ended before its first validation
        rows = pl_module.last_bucket_tables.get("val", [])
        if trainer.is_global_zero and rows:
            log_length_curves(self.run, "val", rows)

    # -- end -----------------------------------------------------------------------------
    def on_fit_end(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule) -> None:
        self.signals.raise_pending()  # a signal Lightning recorded after its last check stops the run here
        if not trainer.is_global_zero:
            return
        rows = pl_module.last_bucket_tables.get("val", [])
        if rows:
            figure = accuracy_vs_length(
                length_curves_of(rows),
                pl_module.train_lengths,
                f"validation accuracy vs source length, after {trainer.current_epoch} epochs",
            )
            self.log_picture(figure_to_array(figure), paths.LENGTH_FIGURE)
        if self.samples:
            self.log_final_heatmaps(trainer, pl_module)
            self.log_explorer(trainer, pl_module)
        self.log_checkpoints(trainer, pl_module)

    def read_best(self) -> dict | None:
        """The best checkpoint's contents (None without one), read from its file once for the heatmaps and
        the model file both."""
        best = self.best.best_model_path
        if self.best_checkpoint is None and best and Path(best).is_file():
            self.best_checkpoint = torch.load(best, map_location="cpu", weights_only=True)
        return self.best_checkpoint

    def log_checkpoints(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule) -> None:
        best = self.best.best_model_path
        if best and Path(best).is_file():
            self.run.log_file(best, paths.CHECKPOINTS)
        if isinstance(self.last, UploadedCheckpoint):
            self.last.upload(trainer)  # stored already unless written since: not copied again
        elif self.last.best_model_path and Path(self.last.best_model_path).is_file():
            self.run.log_file(self.last.best_model_path, paths.CHECKPOINTS)
        checkpoint = self.read_best()
        weights = model_weights(pl_module.state_dict() if checkpoint is None else checkpoint["state_dict"])
        averaging = self.averaging
        self.log_model(trainer, pl_module, weights, paths.MODEL_FILE, paths.MLFLOW_MODEL,
                       None if averaging is None else lambda metric: not averaging.reports(metric))
        if averaging is not None and averaging.averaged is not None:  # the averaged model, logged the same way
            self.log_model(trainer, pl_module, averaging.averaged.weights, paths.AVERAGED_MODEL_FILE,
                           paths.AVERAGED_MODEL, averaging.reports, {tags.AVERAGED: averaging.averaged.description})

    def log_model(self, trainer: L.Trainer, pl_module: Seq2SeqLitModule, weights: dict, artifact: str, name: str,
                  linked: Callable[[str], bool] | None, model_tags: dict[str, str] | None = None) -> None:
        """``weights`` as a portable model file at ``artifact`` and as the run's MLflow model ``name``,
        whose *Logged models* row shows the run's metrics that ``linked`` picks (all: None)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / paths.file_name(artifact)
            torch.save({"model_config": asdict(pl_module.model.config), "state_dict": weights}, path)
            self.run.log_file(path, paths.folder(artifact))
            self.log_mlflow_model(trainer, path, name, linked, model_tags)

    def log_mlflow_model(self, trainer: L.Trainer, model_file: Path, name: str = paths.MLFLOW_MODEL,
                         linked: Callable[[str], bool] | None = None, model_tags: dict[str, str] | None = None) -> None:
        """The run's MLflow model ``name`` (``attnseq.serving``), from the model file just written beside it."""
        data = trainer.datamodule
        config = redact_document(self.resolved_config, paths.RESOLVED_CONFIG)
        written = {}
        for artifact, text in {paths.RESOLVED_CONFIG: config, **vocabulary_files(data)}.items():
            written[artifact] = model_file.with_name(paths.file_name(artifact))
            written[artifact].write_text(text, encoding="utf-8")
        examples = [data.src_tokenizer.detokenize(example.src) for example in data.val_examples[:MODEL_INPUT_EXAMPLES]]
        learned = paths.SRC_TOKENIZER in written
        tokenizers = (written[paths.SRC_TOKENIZER], written[paths.TGT_TOKENIZER]) if learned else None
        log_translator(self.run.client, self.run.run_id, model_file, written[paths.RESOLVED_CONFIG],
                       written[paths.SRC_VOCAB], written[paths.TGT_VOCAB], examples, step=trainer.global_step,
                       tokenizer_files=tokenizers, model_config=asdict(RequestLimits()), name=name, linked=linked,
                       model_tags=model_tags)


def model_weights(state_dict: dict) -> dict:
    """The ``Seq2Seq`` weights of a ``Seq2SeqLitModule`` state dict (its ``model.`` entries)."""
    return {k.removeprefix("model."): v for k, v in state_dict.items() if k.startswith("model.")}


class UploadedCheckpoint(ModelCheckpoint):
    """A ``ModelCheckpoint`` that uploads its file to the run each time it has written it (rank 0),
    so the run's copy is as new as the local one."""

    def __init__(self, run: TrackedRun, **kwargs) -> None:
        super().__init__(**kwargs)
        self.run = run
        self.uploaded: tuple[str, int, int] | None = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args, **kwargs) -> None:
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        self.upload(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        self.upload(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        self.upload(trainer)

    def upload(self, trainer: L.Trainer) -> None:
        path = self.last_model_path or self.best_model_path
        if not trainer.is_global_zero or not path or not Path(path).is_file():
            return
        stat = Path(path).stat()
        written = (path, stat.st_mtime_ns, stat.st_size)
        if written != self.uploaded:
            self.run.log_file(path, paths.CHECKPOINTS)
            self.uploaded = written


class NamedCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, whose failure to write names the checkpoint (a full disk's
    ``OSError`` from ``write`` carries no file name)."""

    def save_checkpoint(self, checkpoint: dict, path: str | os.PathLike, storage_options=None) -> None:
        try:
            super().save_checkpoint(checkpoint, path, storage_options)
        except OSError as error:
            if error.filename is not None:
                raise
            raise OSError(error.errno, error.strerror, str(path)) from error
