"""Evaluate one trained model on a chosen length range: length-bucketed accuracy and exact
match (greedy or beam), overall, per bucket and inside the training lengths; the attention
diagnostics against the gold alignment likewise; for text tasks sacreBLEU and chrF on detokenised
text, overall and per bucket (``attnseq.metrics.translation``); the counterfactual check."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnseq.data import Batch, Example, Seq2SeqDataModule, collate, encode_examples
from attnseq.data.tokenizers import TEXT_TASKS, output_text
from attnseq.evaluation.counterfactual import MODES, CounterfactualTotals, counterfactual_decoder
from attnseq.evaluation.trained_runs import TrainedRun
from attnseq.metrics import DIAGNOSTICS, AttentionDiagnostics, LengthBucketedAccuracy, bucket_name
from attnseq.metrics.length_buckets import LengthBuckets, bucket_digits
from attnseq.metrics.translation import SCORES, signature_params, translation_scores
from attnseq.model import Decoded, greedy_decode
from attnseq.model.beam import beam_search
from attnseq.model.decoding import Encoded


@dataclass(frozen=True)
class EvalSettings:
    lengths: tuple[int, int]
    bucket_width: int
    size: int = 2000
    batch_size: int = 128
    beam_size: int = 1
    counterfactual: bool = True
    seed: int = 0
    sentences: tuple[str, ...] = ()  # source texts whose attention is drawn by name (eval.sentences)


@dataclass
class EvalResult:
    metrics: dict[str, float]
    bucket_rows: list[dict]  # one per bucket: lo, hi, sequences, acc, exact_match, sacrebleu, chrf, cf_* columns
    counterfactual: dict[str, CounterfactualTotals] = field(default_factory=dict)
    long_samples: list[tuple[Example, Decoded]] = field(default_factory=list)
    signatures: dict[str, str] = field(default_factory=dict)  # text tasks: sacrebleu.signature, chrf.signature
    predictions: list[list[int]] = field(default_factory=list)  # per example, in order: the output up to its length
    sentence_samples: list[tuple[str, Example, Decoded]] = field(default_factory=list)  # eval.sentences, decoded


def evaluation_examples(trained: TrainedRun, settings: EvalSettings) -> list[Example]:
    """A held-out test split at ``settings.lengths``, made the way the run made its data."""
    dataset = dict(trained.config["dataset"])
    dataset.update(eval_lengths=list(settings.lengths), test_size=settings.size)
    data = Seq2SeqDataModule(**dataset, seed=int(trained.config["seed"]) + settings.seed,
                             text_tokenizers=(trained.src_tokenizer, trained.tgt_tokenizer))
    data.setup()
    return data.test_examples


def length_limit(trained: TrainedRun, batch: Batch) -> int:
    """The most tokens decoding may emit for ``batch``: the run's ratio × its longest source + extra."""
    decode_config = trained.config["decode"]
    return int(int(batch.src_lengths.max()) * decode_config["max_length_ratio"]) + int(
        decode_config["max_length_extra"]
    )


def decode(trained: TrainedRun, batch: Batch, beam_size: int, encoded: Encoded | None = None) -> Decoded:
    """Greedy (``beam_size`` 1) or beam decoding of ``batch``, from ``encoded`` when given."""
    limit = length_limit(trained, batch)
    if beam_size > 1:
        return beam_search(trained.model, batch.src, batch.src_lengths, beam_size, max_length=limit, encoded=encoded)
    return greedy_decode(trained.model, batch.src, batch.src_lengths, max_length=limit, encoded=encoded)


@torch.inference_mode()
def evaluate_run(trained: TrainedRun, settings: EvalSettings, examples: list[Example] | None = None,
                 progress: Callable[[int], object] | None = None) -> EvalResult:
    """The run's metrics at ``settings``; ``progress`` is told the size of each decoded batch.

    Each batch is encoded once: decoding, the teacher-forced pass and the counterfactual replays
    all read that one encoding (the replays through copies of the decoder alone)."""
    examples = examples if examples is not None else evaluation_examples(trained, settings)
    model, width = trained.model.eval(), settings.bucket_width
    max_length = settings.lengths[1]
    accuracy = LengthBucketedAccuracy(max_length, width)
    diagnostics = AttentionDiagnostics(max_length, width)
    train_lo, train_hi = trained.train_lengths
    # the same, restricted to the lengths the model was trained on: one bucket each
    accuracy_inside = LengthBucketedAccuracy(train_hi, train_hi)
    diagnostics_inside = AttentionDiagnostics(train_hi, train_hi)
    is_text = trained.config["dataset"]["task"] in TEXT_TASKS
    hypotheses: list[str] = []  # text tasks: each example's output, detokenised, in ``ordered`` order
    with_attention = model.attention is not None
    generator = torch.Generator().manual_seed(settings.seed)
    replays = (
        {mode: counterfactual_decoder(model.decoder, mode, generator) for mode in MODES}
        if settings.counterfactual and with_attention
        else {}
    )
    totals = {mode: CounterfactualTotals.empty(max_length, width) for mode in replays}

    order = sorted(range(len(examples)), key=lambda i: len(examples[i].src))  # length-grouped: little padding
    ordered = [examples[i] for i in order]
    predictions: list[list[int]] = [[] for _ in examples]
    tensors = encode_examples(ordered, trained.src_vocab, trained.tgt_vocab)
    for start in range(0, len(tensors), settings.batch_size):
        batch = collate(tensors[start : start + settings.batch_size])
        memory, state = encoded = model.encode(batch.src, batch.src_lengths)
        decoded = decode(trained, batch, settings.beam_size, encoded)
        for i, row, n in zip(order[start:], decoded.tokens.tolist(), decoded.lengths.tolist()):
            predictions[i] = row[:n]
        accuracy.update(decoded.tokens, batch.tgt_out, batch.tgt_lengths, batch.src_lengths)
        seen = (batch.src_lengths >= train_lo) & (batch.src_lengths <= train_hi)  # (B,)
        accuracy_inside.update(
            decoded.tokens[seen], batch.tgt_out[seen], batch.tgt_lengths[seen], batch.src_lengths[seen]
        )
        logits, attention = model.decoder(batch.tgt_in, state, memory)  # teacher forced
        if attention is not None:
            diagnostics.update(attention, batch.alignment, batch.tgt_lengths, batch.src_lengths)
            diagnostics_inside.update(
                attention[seen], batch.alignment[seen], batch.tgt_lengths[seen], batch.src_lengths[seen]
            )
        for mode, replay in replays.items():
            changed, _ = replay(batch.tgt_in, state, memory)
            totals[mode].update(logits, changed, batch.tgt_lengths, batch.src_lengths, width)
        if is_text:
            vocab, tokenizer = trained.tgt_vocab, trained.tgt_tokenizer
            hypotheses += [output_text(ids, vocab, tokenizer) for ids in decoded.tokens.tolist()]
        if progress is not None:
            progress(len(batch))

    metrics = {f"eval/{k}": float(v) for k, v in accuracy.compute().items()}
    inside = accuracy_inside.compute() if int(accuracy_inside.sequences.sum()) else {}
    metrics.update({f"eval/{k}_train_lengths": float(inside[k]) for k in ("acc", "exact_match") if k in inside})
    rows = accuracy.bucket_table()
    if with_attention:
        metrics.update({f"eval/{k}": float(v) for k, v in diagnostics.compute().items()})
        if int(diagnostics_inside.steps.sum()):
            metrics.update({f"eval/{k}_train_lengths": float(v) for k, v in diagnostics_inside.compute().items()})
        for row, diagnosed in zip(rows, diagnostics.bucket_table()):
            row.update({name: diagnosed[name] for name in DIAGNOSTICS})
            metrics.update({f"eval/{name}_len/{row['bucket']}": diagnosed[name] for name in DIAGNOSTICS
                            if diagnosed[name] is not None})
    scored = {}
    if is_text and ordered:
        references = [trained.tgt_tokenizer.detokenize(example.tgt) for example in ordered]
        lengths = [len(example.src) for example in ordered]
        scores = translation_scores(hypotheses, references, lengths, LengthBuckets(max_length, width))
        metrics.update({f"eval/{name}": value for name, value in scores.overall.items()})
        for row, scored_row in zip(rows, scores.buckets, strict=True):
            row.update({name: scored_row[name] for name in SCORES})
            metrics.update({f"eval/{name}_len/{row['bucket']}": scored_row[name] for name in SCORES
                            if scored_row[name] is not None})
        scored = signature_params()
    digits = bucket_digits(max_length)
    for mode, total in totals.items():
        for key, value in total.summary().items():
            metrics[f"eval/cf_{mode}_{key}"] = value
        for row, cf in zip(rows, total.rows()):
            row[f"cf_{mode}_flip_rate"], row[f"cf_{mode}_tv"] = cf["flip_rate"], cf["tv"]
            if cf["flip_rate"] is not None:
                name = bucket_name(cf["lo"], cf["hi"], digits)
                metrics[f"eval/cf_{mode}_flip_len/{name}"] = cf["flip_rate"]
    return EvalResult(
        metrics, rows, totals, long_samples=_longest(trained, ordered, settings), signatures=scored,
        predictions=predictions, sentence_samples=sentence_samples(trained, settings.sentences, settings.beam_size),
    )


def _longest(trained: TrainedRun, ordered: list[Example], settings: EvalSettings, count: int = 3) -> list:
    """The longest few examples, decoded, for heatmaps past the training lengths."""
    if trained.model.attention is None or not ordered:
        return []
    picked = ordered[-count:]
    batch = collate(encode_examples(picked, trained.src_vocab, trained.tgt_vocab))
    decoded = decode(trained, batch, settings.beam_size)
    return [(example, decoded_row(decoded, i)) for i, example in enumerate(picked)]


def sentence_samples(
    trained: TrainedRun, sentences: Sequence[str], beam_size: int
) -> list[tuple[str, Example, Decoded]]:
    """Each source text of ``sentences`` read with the run's own tokenizer and decoded, with its
    attention: ``(text, its example, decoded)``. Tokens outside the run's vocabulary read as UNK;
    a text that holds no token at all is left out. None for a model without attention."""
    if trained.model.attention is None:
        return []
    read = [(text, Example(src=trained.src_tokenizer.tokenize(text), tgt=[], alignment=None)) for text in sentences]
    read = [(text, example) for text, example in read if example.src]
    if not read:
        return []
    batch = collate(encode_examples([example for _, example in read], trained.src_vocab, trained.tgt_vocab))
    decoded = decode(trained, batch, beam_size)
    return [(text, example, decoded_row(decoded, i)) for i, (text, example) in enumerate(read)]


def decoded_row(decoded: Decoded, i: int) -> Decoded:
    n = int(decoded.lengths[i])
    attention: Tensor | None = None if decoded.attention is None else decoded.attention[i, :, :n]
    return Decoded(decoded.tokens[i, :n], decoded.lengths[i], attention)
