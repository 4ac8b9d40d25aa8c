"""Evaluate one trained model on a chosen length range, greedy or beam, with the metrics suite
validation uses (``attnseq.metrics.MetricSuite``, stage ``eval``): accuracy and exact match overall,
per bucket and inside the training lengths; the attention diagnostics likewise; for text tasks
sacreBLEU, chrF and TER against the examples' own text, overall and per bucket; the counterfactual check.
Beam search ranks with GNMT's length penalty ``length_penalty``; with ``n_best`` > 1 each example's n
best hypotheses are kept with their scores (``EvalResult.n_best``), and the metrics read the first."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from torch import Tensor

from attnseq.data import Batch, Example, Seq2SeqData, collate, encode_examples
from attnseq.data.tasks import TASKS, TEXT_TASKS
from attnseq.data.tokenizers import SUBWORD_TOKENIZERS, output_text
from attnseq.evaluation.trained_runs import TrainedRun
from attnseq.faithfulness.counterfactual import MODES, CounterfactualReplay, CounterfactualTotals
from attnseq.faithfulness.explorer import explorer_samples
from attnseq.faithfulness.probe import probe, spread
from attnseq.metrics import BatchOutputs, MetricSuite, SuiteSpec
from attnseq.metrics.faithfulness import FaithSettings
from attnseq.metrics.length_buckets import sequence_hits
from attnseq.metrics.significance import SequenceOutcomes
from attnseq.metrics.translation import signature_params
from attnseq.model import Decoded, decode_length_limit, greedy_decode
from attnseq.model.beam import NBestDecoded, beam_search, beam_search_n_best
from attnseq.model.decoding import Encoded
from attnseq.registry import require_plugins

log = logging.getLogger(__name__)
__all__ = ["N_BEST_COLUMNS", "TEXT_TASKS", "EvalResult", "EvalSettings", "decode", "decode_n_best", "decoded_row",
           "evaluate_run", "evaluation_examples", "length_limit", "metric_suite", "n_best_rows", "self_attention_of",
           "sentence_samples"]

N_BEST_COLUMNS = ("example", "rank", "source", "reference", "output", "score", "log_prob", "length")
"""The n-best table's columns: the example's index (in evaluation order), the hypothesis's rank from 1,
the texts, its ranking score (log p / GNMT's lp(length), log p itself at α = 0), its log-probability and
its tokens (EOS included)."""


@dataclass(frozen=True)
class EvalSettings:
    lengths: tuple[int, int]
    bucket_width: int
    size: int = 2000
    batch_size: int = 128
    beam_size: int = 1
    length_penalty: float = 0.0  # GNMT's α: beam search ranks by log p / ((5 + length) / 6) ** α
    n_best: int = 1  # ≤ beam_size: each example's n best kept (EvalResult.n_best); the metrics read the best
    counterfactual: bool = True
    seed: int = 0
    sentences: tuple[str, ...] = ()  # source texts whose attention is drawn by name (eval.sentences)
    faith: FaithSettings = FaithSettings()  # the faithfulness probe (faith.*; faith.samples=0: off)
    explorer_samples: int = 4  # the attention explorer's examples, spread over the lengths (0: none)


@dataclass
class EvalResult:
    metrics: dict[str, float]
    bucket_rows: list[dict]  # one per bucket: lo, hi, sequences, acc, exact_match, sacrebleu, chrf, cf_* columns
    counterfactual: dict[str, CounterfactualTotals] = field(default_factory=dict)
    long_samples: list[tuple[Example, Decoded]] = field(default_factory=list)
    signatures: dict[str, str] = field(default_factory=dict)  # text tasks: each score's <name>.signature
    predictions: list[list[int]] = field(default_factory=list)  # per example, in order: the output up to its length
    sentence_samples: list[tuple[str, Example, Decoded]] = field(default_factory=list)  # eval.sentences, decoded
    n_best: list[dict] = field(default_factory=list)  # n_best > 1: a row per example and rank (N_BEST_COLUMNS)
    outcomes: SequenceOutcomes | None = None  # per test sequence, for the comparison's paired tests (in memory)
    explorer: list[dict] = field(default_factory=list)  # the attention explorer's samples (explorer_samples)
    explorer_examples: list[Example] = field(default_factory=list)  # the examples they are of
    spec: SuiteSpec | None = None  # what the evaluation measured: the metric registry's names for it (names(spec))


def evaluation_examples(trained: TrainedRun, settings: EvalSettings) -> list[Example]:
    """A held-out test split at ``settings.lengths``, made the way the run made its data (its
    ``plugins``, imported on request first: a task defined outside attnseq registers itself)."""
    require_plugins(trained.config.get("plugins") or ())
    dataset = dict(trained.config["dataset"])
    # evaluation batches by eval.batch_size: the run's token budget need not hold the longer lengths
    dataset.update(eval_lengths=list(settings.lengths), test_size=settings.size, batch_type="sentence")
    data = Seq2SeqData(**dataset, seed=int(trained.config["seed"]) + settings.seed,
                             text_tokenizers=(trained.src_tokenizer, trained.tgt_tokenizer))
    data.setup()
    return data.test_examples


def length_limit(trained: TrainedRun, batch: Batch) -> int:
    """The most tokens decoding may emit for ``batch``: ``decode_length_limit`` with the run's own
    ``decode.max_length_ratio`` and ``decode.max_length_extra``, as its validation decoded."""
    decode_config = trained.config["decode"]
    return decode_length_limit(batch.src_lengths, decode_config["max_length_ratio"], decode_config["max_length_extra"])


def metric_suite(trained: TrainedRun, settings: EvalSettings) -> MetricSuite:
    """The suite of ``eval/`` metrics for ``trained`` at ``settings`` (with the metrics its ``plugins`` define)."""
    require_plugins(trained.config.get("plugins") or ())
    task = trained.config["dataset"]["task"]
    text = TASKS.lookup(task).is_text
    return MetricSuite(SuiteSpec(
        "eval",
        max_length=settings.lengths[1],
        bucket_width=settings.bucket_width,
        train_lengths=tuple(trained.train_lengths),
        attention=trained.model.attention is not None,
        gold_alignment=TASKS.lookup(task).has_gold_alignment,
        text=text,
        counterfactual=settings.counterfactual,
        faith=settings.faith.groups(),
        to_text=partial(output_text, vocab=trained.tgt_vocab, tokenizer=trained.tgt_tokenizer) if text else None,
    ))


def decode(trained: TrainedRun, batch: Batch, beam_size: int, encoded: Encoded | None = None,
           keep_attention: bool = True, length_penalty: float = 0.0) -> Decoded:
    """Greedy (``beam_size`` 1) or beam decoding of ``batch`` (ranked with GNMT's ``length_penalty``),
    from ``encoded`` when given."""
    limit = length_limit(trained, batch)
    if beam_size > 1:
        return beam_search(trained.model, batch.src, batch.src_lengths, beam_size, max_length=limit, encoded=encoded,
                           keep_attention=keep_attention, length_penalty=length_penalty)
    return greedy_decode(trained.model, batch.src, batch.src_lengths, max_length=limit, encoded=encoded,
                         keep_attention=keep_attention)


def decode_n_best(trained: TrainedRun, batch: Batch, settings: EvalSettings,
                  encoded: Encoded | None = None) -> NBestDecoded:
    """The ``settings.n_best`` best hypotheses of each of ``batch``'s examples (no attention kept)."""
    return beam_search_n_best(trained.model, batch.src, batch.src_lengths, settings.beam_size, settings.n_best,
                              max_length=length_limit(trained, batch), length_penalty=settings.length_penalty,
                              encoded=encoded, keep_attention=False)


def n_best_rows(trained: TrainedRun, found: NBestDecoded, examples: Sequence[Example],
                indices: Sequence[int]) -> list[dict]:
    """The n-best table's rows (``N_BEST_COLUMNS``) of ``examples``, decoded as ``found``, whose indices
    in evaluation order are ``indices``; the fillers where fewer hypotheses exist are left out."""
    to_text = partial(output_text, vocab=trained.tgt_vocab, tokenizer=trained.tgt_tokenizer)
    rows = []
    for b, (index, example) in enumerate(zip(indices, examples)):
        for k in range(found.tokens.shape[1]):
            log_prob, n = float(found.scores[b, k]), int(found.lengths[b, k])
            if math.isfinite(log_prob):
                rows.append(dict(zip(N_BEST_COLUMNS, (
                    index, k + 1, trained.src_tokenizer.detokenize(example.src),
                    trained.tgt_tokenizer.detokenize(example.tgt), to_text(found.tokens[b, k, :n].tolist()),
                    float(found.rank_scores[b, k]), log_prob, n))))
    return rows


@torch.inference_mode()
def evaluate_run(trained: TrainedRun, settings: EvalSettings, examples: list[Example] | None = None,
                 progress: Callable[[int], object] | None = None) -> EvalResult:
    """The run's metrics at ``settings``; ``progress`` is told the size of each decoded batch.

    Each batch is encoded once: decoding, the teacher-forced pass and the counterfactual replays
    all read that one encoding (the replays: ``CounterfactualReplay``, one per mode, built once)."""
    examples = examples if examples is not None else evaluation_examples(trained, settings)
    model = trained.model.eval()
    suite = metric_suite(trained, settings)
    generator = torch.Generator().manual_seed(settings.seed)
    replays = (
        {mode: CounterfactualReplay(model.decoder, mode, generator) for mode in MODES}
        if "counterfactual" in suite.members
        else {}
    )

    order = sorted(range(len(examples)), key=lambda i: len(examples[i].src))  # length-grouped: little padding
    ordered = [examples[i] for i in order]
    predictions: list[list[int]] = [[] for _ in examples]
    n_best: list[dict] = []
    hits: list[tuple[list[int], list[int]]] = []  # per batch: correct and real target positions per sequence
    tensors = encode_examples(ordered, trained.src_vocab, trained.tgt_vocab)
    probed = set(spread([len(e.src) for e in ordered], settings.faith.samples)) if "faithfulness" in suite.members \
        else set()  # the faithfulness probe's sequences, spread over the lengths
    for start in range(0, len(tensors), settings.batch_size):
        batch = collate(tensors[start : start + settings.batch_size])
        memory, state = encoded = model.encode(batch.src, batch.src_lengths)
        if settings.n_best > 1:  # the first of the n best is beam_search's output: the metrics of n_best=1
            found = decode_n_best(trained, batch, settings, encoded)
            decoded = found.best()
            rows = slice(start, start + len(batch))
            n_best += n_best_rows(trained, found, ordered[rows], order[rows])
        else:
            decoded = decode(trained, batch, settings.beam_size, encoded, keep_attention=False,  # the tokens alone
                             length_penalty=settings.length_penalty)
        for i, row, n in zip(order[start:], decoded.tokens.tolist(), decoded.lengths.tolist()):
            predictions[i] = row[:n]
        correct, real = sequence_hits(decoded.tokens, batch.tgt_out, batch.tgt_lengths)  # (B,) each
        hits.append((correct.tolist(), real.tolist()))
        logits, attention = model.decoder(batch.tgt_in, state, memory)  # teacher forced
        replayed = {mode: replay(batch.tgt_in, state, memory) for mode, replay in replays.items()}
        references = (
            [trained.tgt_tokenizer.detokenize(example.tgt) for example in ordered[start : start + len(batch)]]
            if suite.spec.text
            else None
        )
        suite.update(BatchOutputs.of(batch, decoded.tokens, attention=attention, logits=logits, replayed=replayed,
                                     references=references))
        probed_rows = [i for i in range(len(batch)) if start + i in probed]
        if probed_rows:
            picked = torch.tensor(probed_rows)  # (N,)
            suite.update_faithfulness(probe(model, batch.src[picked], batch.src_lengths[picked], batch.tgt_in[picked],
                                            batch.tgt_lengths[picked], settings.faith), settings.faith.alpha)
        if progress is not None:
            progress(len(batch))

    metrics = {name: float(value) for name, value in suite.compute().items()}
    rows = suite.bucket_rows()
    totals = suite.members["counterfactual"].totals if "counterfactual" in suite.members else {}
    scored = signature_params() if suite.spec.text and ordered else {}
    return EvalResult(
        metrics, rows, totals, long_samples=_longest(trained, ordered, settings), signatures=scored,
        predictions=predictions, n_best=sorted(n_best, key=lambda row: (row["example"], row["rank"])),
        sentence_samples=sentence_samples(trained, settings.sentences, settings.beam_size, settings.length_penalty),
        outcomes=sequence_outcomes(ordered, hits, suite), **explorer_of(trained, ordered, settings), spec=suite.spec,
    )


def explorer_of(trained: TrainedRun, ordered: list[Example], settings: EvalSettings) -> dict[str, list]:
    """``EvalResult``'s ``explorer`` and ``explorer_examples``: ``settings.explorer_samples`` examples spread over
    the lengths (``spread``), decoded greedily, with the importance measures of ``settings.faith``; none for a
    model without attention."""
    if trained.model.attention is None or not ordered or settings.explorer_samples == 0:
        return {}
    picked = [ordered[i] for i in spread([len(e.src) for e in ordered], settings.explorer_samples)]
    decode_config = trained.config["decode"]
    limit = decode_length_limit(torch.tensor([len(picked[-1].src)]), decode_config["max_length_ratio"],
                                decode_config["max_length_extra"])  # as length_limit of a batch of them
    found = explorer_samples(trained.model, picked, trained.src_vocab, trained.tgt_vocab, limit, settings.faith,
                             labels=[f"example {k + 1}" for k in range(len(picked))])
    return {"explorer": found, "explorer_examples": picked}


def sequence_outcomes(ordered: Sequence[Example], hits: Sequence[tuple[list[int], list[int]]],
                      suite: MetricSuite) -> SequenceOutcomes:
    """Each evaluated sequence (in evaluation order) with its correct and real target positions and,
    for text tasks, its output and reference as the scores read them: what the comparison pairs."""
    text = suite.members["translation"].sentences() if "translation" in suite.members else None
    return SequenceOutcomes(
        keys=tuple((tuple(example.src), tuple(example.tgt)) for example in ordered),
        correct=np.array([c for correct, _ in hits for c in correct], dtype=np.int64),
        tokens=np.array([t for _, tokens in hits for t in tokens], dtype=np.int64),
        hypotheses=None if text is None else tuple(text[0]),
        references=None if text is None else tuple(text[1]),
    )


def _longest(trained: TrainedRun, ordered: list[Example], settings: EvalSettings, count: int = 3) -> list:
    """The longest few examples, decoded, for heatmaps past the training lengths."""
    if trained.model.attention is None or not ordered:
        return []
    picked = ordered[-count:]
    batch = collate(encode_examples(picked, trained.src_vocab, trained.tgt_vocab))
    decoded = decode(trained, batch, settings.beam_size, length_penalty=settings.length_penalty)
    return [(example, decoded_row(decoded, i)) for i, example in enumerate(picked)]


def sentence_samples(
    trained: TrainedRun, sentences: Sequence[str], beam_size: int, length_penalty: float = 0.0
) -> list[tuple[str, Example, Decoded]]:
    """Each source text of ``sentences`` read with the run's own tokenizer and decoded, with its
    attention: ``(text, its example, decoded)``. Tokens outside the run's vocabulary read as UNK (a
    warning names them); a text that holds no token at all is left out. None for a model without attention."""
    if trained.model.attention is None:
        return []
    read = [(text, Example(src=trained.src_tokenizer.tokenize(text), tgt=[], alignment=None)) for text in sentences]
    unknown = sorted({token for _, example in read for token in example.src if token not in trained.src_vocab})
    if unknown and trained.src_tokenizer.kind not in SUBWORD_TOKENIZERS:
        log.warning("eval.sentences: %d word(s) outside %s's vocabulary read as <unk>: %s", len(unknown),
                    trained.name, " ".join(unknown[:20]) + (" …" if len(unknown) > 20 else ""))
    read = [(text, example) for text, example in read if example.src]
    if not read:
        return []
    batch = collate(encode_examples([example for _, example in read], trained.src_vocab, trained.tgt_vocab))
    decoded = decode(trained, batch, beam_size, length_penalty=length_penalty)
    return [(text, example, decoded_row(decoded, i)) for i, (text, example) in enumerate(read)]


def self_attention_of(trained: TrainedRun, example: Example, decoded: Decoded) -> dict[str, list[np.ndarray]]:
    """The self-attention maps (``Seq2Seq.sequence_self_attention``) of one example as the run decoded it
    (``decoded``: a row, ``decoded_row``), by stack, per layer ``(H, T, T)``; empty for RNN stacks."""
    src = torch.tensor(trained.src_vocab.encode(example.src))  # (T_src,)
    return trained.model.sequence_self_attention(src, decoded.tokens[: int(decoded.lengths)])


def decoded_row(decoded: Decoded, i: int) -> Decoded:
    n = int(decoded.lengths[i])
    attention: Tensor | None = None if decoded.attention is None else decoded.attention[i, :, :n]
    return Decoded(decoded.tokens[i, :n], decoded.lengths[i], attention)
