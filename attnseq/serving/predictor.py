"""``Translator``: a trained model with its vocabularies and decoding settings, turning source text
into output text. It is what the MLflow model runs, and it imports no MLflow.

A source is read the way the run read its data (``attnseq.data.tokenizers``): a symbol or
toy-translation task's tokens are separated by spaces (``"s3 s1 s4"``); a TSV corpus's text goes
through the run's source tokenizer, and each output's tokens are detokenised by its target
tokenizer (subword pieces joined back into words). A source token outside the vocabulary is an
error naming it, except subword pieces: those become the unknown token, as in training. Every
output stops at EOS, or at the run's validation limit of ``decode.max_length_ratio × source
length + decode.max_length_extra`` tokens. Sources are batched by length, so each output is the
one its source would get decoded alone, by greedy decoding or by beam search; ``translate_n_best``
gives each source's n best outputs of a beam (``Hypothesis``: its text and scores), the first of them
``translate``'s output.

A request's cost is bounded by ``RequestLimits`` (the model's MLflow ``model_config``): the beam width,
each source's tokens and each output's; no step's attention is kept. A refused source is echoed short.

Nothing is unpickled: the config is YAML, the vocabularies and tokenizers JSON, and the weights are
read with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor

from attnseq.data import SPECIAL_TOKENS, Vocabulary
from attnseq.data.tasks import tokenizer_for
from attnseq.data.tokenizers import SUBWORD_TOKENIZERS, TextTokenizer, output_text
from attnseq.errors import ProblemAndFix
from attnseq.model import (
    BeamDecoded,
    Decoded,
    NBestDecoded,
    Seq2Seq,
    beam_search,
    beam_search_n_best,
    greedy_decode,
    load_saved_model,
)
from attnseq.model.config import MAX_BEAM_SIZE

BATCH_SIZE = 256
"""Sources of one length are decoded together, this many at most."""
SHOWN_TOKENS = 12
"""How many vocabulary tokens an unknown-token error lists as examples (and unknown tokens it names)."""
SHOWN_CHARS = 60
"""How much of a refused source (or token) an error echoes."""


@dataclass(frozen=True)
class RequestLimits:
    """What one request may cost; logged as the model's ``model_config``, so a server sets others with
    ``MLFLOW_PYFUNC_INFERENCE_CONFIG='{"max_beam_size": 32}'`` (or ``load_model(..., model_config=...)``)."""

    max_beam_size: int = MAX_BEAM_SIZE  # each decoding step costs beam_size × a greedy one
    max_source_tokens: int = 256  # the run trained on far shorter sources; time grows with the length
    max_output_tokens: int = 512  # each output stops here, or earlier at the decode limit

    @classmethod
    def of(cls, model_config: Mapping[str, Any] | None) -> RequestLimits:
        known = {key: int(value) for key, value in (model_config or {}).items() if key in cls.__dataclass_fields__}
        return cls(**known)


def quoted(text: Any) -> str:
    """``repr(text)``, cut to its first ``SHOWN_CHARS`` characters (and its length) when longer."""
    if not isinstance(text, str) or len(text) <= SHOWN_CHARS:
        return repr(text)
    return f"{text[:SHOWN_CHARS]!r}… ({len(text)} characters)"


class InvalidSource(ProblemAndFix):
    """A source the model cannot read: empty, or with tokens its vocabulary does not hold."""


@dataclass(frozen=True)
class DecodeLimit:
    """``ratio × source length + extra`` output tokens at most, as at validation (``decode.*``)."""

    ratio: float = 1.5
    extra: int = 5

    @classmethod
    def of_config(cls, config: Mapping[str, Any]) -> DecodeLimit:
        decode = config.get("decode", {})
        return cls(float(decode.get("max_length_ratio", cls.ratio)), int(decode.get("max_length_extra", cls.extra)))

    def __call__(self, source_length: int) -> int:
        return int(source_length * self.ratio) + self.extra


@dataclass(frozen=True)
class Hypothesis:
    """One of a source's n best outputs."""

    output: str  # the output text (detokenised, EOS dropped)
    score: float  # what ranked it: log p / ((5 + n) / 6) ** α, n its tokens with EOS; log p itself at α = 0
    log_prob: float  # log p(output | source), summed over its tokens, EOS included


class Translator:
    def __init__(
        self,
        model: Seq2Seq,
        src_vocab: Vocabulary,
        tgt_vocab: Vocabulary,
        src_tokenizer: TextTokenizer,
        tgt_tokenizer: TextTokenizer,
        limit: DecodeLimit,
        limits: RequestLimits = RequestLimits(),
    ) -> None:
        self.model = model
        self.src_vocab = src_vocab
        self.tgt_vocab = tgt_vocab
        self.src_tokenizer = src_tokenizer
        self.tgt_tokenizer = tgt_tokenizer
        self.limit = limit
        self.limits = limits

    @classmethod
    def from_files(cls, model_file: str | Path, config_file: str | Path, src_vocab_file: str | Path,
                   tgt_vocab_file: str | Path, src_tokenizer_file: str | Path | None = None,
                   tgt_tokenizer_file: str | Path | None = None, limits: RequestLimits = RequestLimits()) -> Translator:
        """From a run's model file, resolved config (YAML), vocabularies (JSON) and, for a subword
        run, tokenizers (JSON); ``limits``: what one request may cost."""
        config = yaml.safe_load(Path(config_file).read_text(encoding="utf-8")) or {}
        dataset = config.get("dataset", {})
        src_tokenizer, tgt_tokenizer = (
            tokenizer_for(dataset, None if file is None else Path(file).read_text(encoding="utf-8"))
            for file in (src_tokenizer_file, tgt_tokenizer_file)
        )
        return cls(
            load_saved_model(model_file),
            Vocabulary.load(src_vocab_file),
            Vocabulary.load(tgt_vocab_file),
            src_tokenizer,
            tgt_tokenizer,
            DecodeLimit.of_config(config),
            limits,
        )

    def encode(self, sources: Sequence[str]) -> list[list[int]]:
        """Each source's token ids; ``InvalidSource`` naming the first bad source."""
        encoded = []
        for row, text in enumerate(sources):
            tokens = self.src_tokenizer.tokenize(text) if isinstance(text, str) else []
            if not tokens:
                raise InvalidSource(
                    f"source {row} ({quoted(text)}) holds no tokens.",
                    "give every source at least one token, e.g. \"" + self.example_source() + '".',
                )
            if len(tokens) > self.limits.max_source_tokens:
                raise InvalidSource(
                    # not "max_source_tokens=256": a console that masks secrets reads a *_tokens= value as one
                    f"source {row} ({quoted(text)}) holds {len(tokens)} tokens, more than the served model's "
                    f"limit of {self.limits.max_source_tokens} (max_source_tokens).",
                    "split it into shorter sources, or serve the model with a higher limit: "
                    "MLFLOW_PYFUNC_INFERENCE_CONFIG='{\"max_source_tokens\": " f"{len(tokens)}}}'.",
                )
            open_vocabulary = self.src_tokenizer.kind in SUBWORD_TOKENIZERS
            unknown = [] if open_vocabulary else sorted({token for token in tokens if token not in self.src_vocab})
            if unknown:
                raise InvalidSource(
                    f"source {row} ({quoted(text)}) has tokens the model's vocabulary does not hold: "
                    f"{', '.join(quoted(t) for t in unknown[:SHOWN_TOKENS])}"
                    f"{' …' if len(unknown) > SHOWN_TOKENS else ''}.",
                    f"use only the {len(self.known_tokens())} tokens it was trained on: "
                    f"{' '.join(self.known_tokens()[:SHOWN_TOKENS])}"
                    f"{' …' if len(self.known_tokens()) > SHOWN_TOKENS else ''}.",
                )
            encoded.append(self.src_vocab.encode(tokens))
        return encoded

    def known_tokens(self) -> list[str]:
        """The source tokens the model was trained on (the vocabulary less its special tokens)."""
        return self.src_vocab.tokens[len(SPECIAL_TOKENS):]

    def example_source(self) -> str:
        return self.src_tokenizer.detokenize(self.known_tokens()[:3])

    @torch.no_grad()
    def translate(self, sources: Sequence[str], beam_size: int = 1, length_penalty: float = 0.0) -> list[str]:
        """The output text of each source: greedy with ``beam_size=1``, beam search above."""
        beam_size, length_penalty = self.checked(beam_size, length_penalty)
        outputs: list[str] = [""] * len(sources)
        for rows, src in self.batches(self.encode(sources)):
            for row, text in zip(rows, self.translate_batch(src, beam_size, length_penalty)):
                outputs[row] = text
        return outputs

    @torch.no_grad()
    def translate_n_best(self, sources: Sequence[str], beam_size: int, n_best: int,
                         length_penalty: float = 0.0) -> list[list[Hypothesis]]:
        """The ``n_best ≤ beam_size`` best outputs of each source, best first, by the ranking of a beam of
        ``beam_size`` with GNMT's ``length_penalty`` (``beam_search_n_best``): the first is ``translate``'s
        output. Fewer than ``n_best`` only where fewer outputs exist (a beam wider than the vocabulary)."""
        beam_size, length_penalty = self.checked(beam_size, length_penalty)
        whole = isinstance(n_best, Integral) and not isinstance(n_best, bool)
        if not whole or not 1 <= n_best <= beam_size:
            wider = whole and beam_size < n_best <= self.limits.max_beam_size
            raise InvalidSource(f"n_best={quoted(n_best)} must be a whole number in [1, beam_size={beam_size}]: a "
                                "beam keeps beam_size hypotheses.",
                                f"pass beam_size={n_best} (or wider) with n_best={n_best}, or n_best={beam_size}."
                                if wider else f"pass n_best from 1 to beam_size, e.g. n_best={beam_size}.")
        hypotheses: list[list[Hypothesis]] = [[] for _ in sources]
        for rows, src in self.batches(self.encode(sources)):
            found = self.decode_n_best(src, beam_size, int(n_best), length_penalty)
            for i, row in enumerate(rows):
                hypotheses[row] = [
                    Hypothesis(self.output_text(found.tokens[i, k, : int(found.lengths[i, k])].tolist()),
                               float(found.rank_scores[i, k]), float(found.scores[i, k]))
                    for k in range(found.tokens.shape[1]) if math.isfinite(float(found.scores[i, k]))
                ]
        return hypotheses

    def checked(self, beam_size: Any, length_penalty: Any) -> tuple[int, float]:
        """A request's beam width and length penalty, or ``InvalidSource`` naming the bad one."""
        most = self.limits.max_beam_size
        if isinstance(beam_size, bool) or not isinstance(beam_size, Integral) or not 1 <= beam_size <= most:
            raise InvalidSource(f"beam_size={quoted(beam_size)} must be a whole number in [1, {most}] (the served "
                                f"model's max_beam_size).", f"pass beam_size=1 (greedy) or a beam width up to {most}, "
                                "e.g. 5; a server allows wider ones with MLFLOW_PYFUNC_INFERENCE_CONFIG="
                                "'{\"max_beam_size\": 32}'.")
        if isinstance(length_penalty, bool) or not isinstance(length_penalty, Real) \
                or not 0.0 <= length_penalty < math.inf:
            raise InvalidSource(f"length_penalty={quoted(length_penalty)} must be a finite number ≥ 0.",
                                "pass 0 (rank by log-probability) or GNMT's α, e.g. 0.6.")
        return int(beam_size), float(length_penalty)

    @staticmethod
    def batches(encoded: list[list[int]]) -> Iterator[tuple[list[int], Tensor]]:
        """``(rows, src (B, T_src))``: the sources of one length together (each output gets its own
        limit), ``BATCH_SIZE`` at most."""
        by_length: dict[int, list[int]] = {}
        for row, ids in enumerate(encoded):
            by_length.setdefault(len(ids), []).append(row)
        for rows in by_length.values():
            for start in range(0, len(rows), BATCH_SIZE):
                chunk = rows[start:start + BATCH_SIZE]
                yield chunk, torch.tensor([encoded[row] for row in chunk])  # (B, T_src)

    def output_text(self, ids: list[int]) -> str:
        return output_text(ids, self.tgt_vocab, self.tgt_tokenizer)

    def translate_batch(self, src: Tensor, beam_size: int, length_penalty: float) -> list[str]:
        """Sources of one length, ``src (B, T_src)``."""
        decoded = self.decode_batch(src, beam_size, length_penalty)
        return [self.output_text(decoded.tokens[row, : int(decoded.lengths[row])].tolist())
                for row in range(src.shape[0])]

    def output_limit(self, src: Tensor) -> tuple[Tensor, int]:
        """Sources of one length ``src (B, T_src)``: their lengths ``(B,)``, and the most tokens an output holds."""
        lengths = torch.full((src.shape[0],), src.shape[1], dtype=torch.long)  # (B,)
        return lengths, min(self.limit(src.shape[1]), self.limits.max_output_tokens)

    @torch.no_grad()
    def decode_n_best(self, src: Tensor, beam_size: int, n_best: int, length_penalty: float) -> NBestDecoded:
        """Sources of one length, ``src (B, T_src)``: their n best within the limits, no attention kept."""
        lengths, max_length = self.output_limit(src)
        return beam_search_n_best(self.model, src, lengths, beam_size, n_best, max_length,
                                  length_penalty=length_penalty, keep_attention=False)

    @torch.no_grad()
    def decode_batch(self, src: Tensor, beam_size: int, length_penalty: float,
                     keep_attention: bool = False) -> Decoded | BeamDecoded:
        """Sources of one length, ``src (B, T_src)``, decoded within the limits (``keep_attention``:
        each step's attention too, for a heatmap: what a served request never keeps)."""
        lengths, max_length = self.output_limit(src)
        if beam_size == 1:
            return greedy_decode(self.model, src, lengths, max_length=max_length, keep_attention=keep_attention)
        return beam_search(self.model, src, lengths, beam_size, max_length, length_penalty=length_penalty,
                           keep_attention=keep_attention)
