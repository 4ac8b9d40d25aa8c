"""Batched beam search, and teacher-forced scoring of given output sequences.

``beam_search`` runs all B·K hypotheses through ``decoder.step`` together, as one batch of B·K
rows (beam k of item b is row b·K + k). Conventions follow ``greedy_decode``: the output holds
the tokens up to and including EOS, then PAD; a hypothesis without EOS has length ``max_length``.

How the search works (the "finished hypotheses keep their slot" variant):

- each step, a live hypothesis offers V extensions, a finished one (it emitted EOS) offers only
  itself, unchanged; the K best of these candidates fill the K slots. At step 0 only slot 0 is
  expanded (the others start at -inf), so the K slots never hold copies of one hypothesis.
- ranking: the raw log-probability, or with ``length_penalty=α > 0`` the raw log-probability
  divided by GNMT's ``lp(n) = ((5 + n) / 6) ** α`` (Wu et al. 2016) of the hypothesis length n.
  ``scores`` always report the raw log-probability, whatever ranked the hypotheses.
- an item stops when its best finished hypothesis ranks at least as high as any live one could
  ever reach: log-probabilities only fall, so a live hypothesis with raw score s ≤ 0 can end at
  most at ``s / lp(max_length)`` (for α ≥ 0). Its live hypotheses are then dropped. The loop ends
  when every item has stopped, or at ``max_length``; hypotheses still live there compete as
  they are, with length ``max_length``.

With K = 1 this is exactly greedy decoding. With K at least the number of complete output
sequences it is exhaustive, so it returns the exact argmax of the ranking.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnseq.data.vocab import BOS, EOS, PAD
from attnseq.model.decoding import Encoded, greedy_decode
from attnseq.model.seq2seq import Seq2Seq
from attnseq.model.state import select_memory, select_state


class BeamDecoded(NamedTuple):
    tokens: Tensor  # (B, T_out): the output up to and including EOS, then PAD
    lengths: Tensor  # (B,): tokens up to and including EOS (max_length where no EOS came)
    attention: Tensor | None  # (B, H, T_out, T_enc); zeros after a sequence's EOS
    scores: Tensor  # (B,): raw model log-probability of ``tokens`` (EOS included), never length-normalised


def length_penalty_factor(lengths: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT's ``lp(n) = ((5 + n) / 6) ** α``; the ranking score is ``log p / lp(n)``.

    ``α = 0`` gives exactly 1, so the ranking is then the raw log-probability.
    """
    return ((5.0 + lengths) / 6.0) ** alpha


def _log_probs(logits: Tensor) -> Tensor:
    """log-softmax over the vocabulary, in at least float32 (half precision loses the ranking)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)


@torch.no_grad()
def sequence_log_prob(
    model: Seq2Seq,
    src: Tensor,
    src_lengths: Tensor,
    tokens: Tensor,
    lengths: Tensor,
    bos_id: int = BOS,
    encoded: Encoded | None = None,
) -> Tensor:
    """Score given outputs ``tokens (B, T_out)`` by teacher forcing: ``log p(tokens[:length] | src)``.

    The decoder reads BOS + ``tokens[:, :-1]``; the sum runs over the first ``lengths[b]``
    positions (EOS included where the sequence has one). Returns ``(B,)``. Call it in eval mode:
    dropout would make the scores random. ``encoded``: ``model.encode(src, src_lengths)`` if at hand.
    """
    bos = torch.full_like(tokens[:, :1], bos_id)  # (B, 1)
    tgt_in = torch.cat([bos, tokens[:, :-1]], dim=1)  # (B, T_out)
    memory, state = encoded if encoded is not None else model.encode(src, src_lengths)
    logits, _ = model.decoder(tgt_in, state, memory, teacher_forcing=1.0)  # (B, T_out, V)
    token_log_probs = _log_probs(logits).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B, T_out)
    positions = torch.arange(tokens.shape[1], device=tokens.device)  # (T_out,)
    inside = positions[None, :] < lengths[:, None]  # (B, T_out)
    return token_log_probs.masked_fill(~inside, 0.0).sum(dim=1)  # (B,)


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: Tensor,
    src_lengths: Tensor,
    beam_size: int,
    max_length: int,
    length_penalty: float = 0.0,
    greedy_fallback: bool = True,
    bos_id: int = BOS,
    eos_id: int = EOS,
    pad_id: int = PAD,
    check_every: int = 4,
    encoded: Encoded | None = None,
    keep_attention: bool = True,
) -> BeamDecoded:
    """Decode a padded batch with a beam of ``beam_size`` hypotheses per item (see module docstring).

    Returns the best hypothesis per item: ``tokens (B, T_out)`` with ``T_out = lengths.max()``,
    ``lengths (B,)``, its ``attention (B, H, T_out, T_enc)`` (None without attention) and
    ``scores (B,)``, its raw log-probability Σ log p(y_t | y_<t, src) over every emitted token up to
    and including EOS. With ``length_penalty > 0`` the hypotheses are *ranked* by
    ``log p / lp(length)``, but ``scores`` still hold the raw log-probability.

    **Never worse than greedy, by construction.** Plain beam search does not guarantee that a
    width-K beam finds a sequence at least as probable as greedy decoding's: the greedy prefix can
    fall out of the beam. So with ``greedy_fallback`` (the default) and ``beam_size > 1`` this
    also runs ``greedy_decode``, scores its output with ``sequence_log_prob`` and returns, per item,
    whichever ranks higher (the greedy one when the two are the same sequence). The guarantee is
    thus one of this function, not of the search itself; it costs one greedy decode and one
    teacher-forced pass. Under a length penalty the comparison uses the same penalised ranking.
    ``greedy_fallback=False`` returns the beam's own best, for studying the search alone.

    ``beam_size=1`` is greedy decoding exactly (tokens, lengths and attention; ``T_out`` as from
    ``greedy_decode(..., check_every=1)``, which may return extra PAD columns otherwise), barring
    two log-probabilities that round to the same value. As in greedy decoding, any id may be
    emitted before EOS, PAD/BOS/UNK included. Runs without gradients and changes nothing on the
    model; call it in eval mode. Whether all items have stopped is read back from the device only
    every ``check_every`` steps; that changes when the loop ends, never the result. ``encoded``:
    ``model.encode(src, src_lengths)`` when the caller has it; the search and the fallback share it.
    ``keep_attention=False``: no step's weights are kept (``attention`` is None; B·K·H·T_enc floats a step).
    """
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size={beam_size!r} must be a positive integer.")
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length={max_length!r} must be a positive integer.")
    if length_penalty < 0:
        raise ValueError(
            f"length_penalty={length_penalty!r} must be ≥ 0: the early stop relies on it (0 = no penalty)."
        )
    encoded = encoded if encoded is not None else model.encode(src, src_lengths)
    best = _beam_core(model, encoded, beam_size, max_length, length_penalty, bos_id, eos_id, pad_id, check_every,
                      keep_attention)
    if greedy_fallback and beam_size > 1:
        greedy = greedy_decode(
            model, src, src_lengths, max_length, bos_id, eos_id, pad_id, check_every, encoded=encoded,
            keep_attention=keep_attention,
        )
        greedy_scores = sequence_log_prob(
            model, src, src_lengths, greedy.tokens, greedy.lengths, bos_id, encoded=encoded
        )  # (B,)
        greedy = BeamDecoded(*greedy, scores=greedy_scores)
        best = _pick_better(best, greedy, length_penalty)
    return _trim(best)


def _beam_core(
    model: Seq2Seq,
    encoded: Encoded,
    beam_size: int,
    max_length: int,
    alpha: float,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    check_every: int,
    keep_attention: bool = True,
) -> BeamDecoded:
    """The beam search itself; the output is ``max``-padded to the number of steps it ran."""
    memory, state = encoded
    device = memory.keys.device
    batch, width = memory.keys.shape[0], beam_size
    expand = torch.arange(batch, device=device).repeat_interleave(width)  # (B*K,): row b*K + k ← item b
    memory = select_memory(memory, expand)  # keys (B*K, T_enc, d_k)
    state = select_state(state, expand)  # rnn (L, B*K, d_s)
    row_base = (torch.arange(batch, device=device) * width)[:, None]  # (B, 1)

    prev_tokens = torch.full((batch * width,), bos_id, dtype=torch.long, device=device)  # (B*K,)
    raw: Tensor | None = None  # (B, K): log p of each slot's hypothesis; dtype from the first step
    finished = torch.zeros(batch, width, dtype=torch.bool, device=device)  # (B, K)
    lengths = torch.full((batch, width), max_length, dtype=torch.long, device=device)  # (B, K)
    step_tokens: list[Tensor] = []  # per step (B, K): the token slot k took
    step_origins: list[Tensor] = []  # per step (B, K): the slot it came from at the step before
    step_weights: list[Tensor] = []  # per step (B, K, H, T_enc)

    for t in range(max_length):
        logits, weights, new_state = model.decoder.step(prev_tokens, state, memory)  # (B*K, V), (B*K, H, T_enc)
        vocab = logits.shape[-1]
        log_probs = _log_probs(logits).view(batch, width, vocab)  # (B, K, V)
        if raw is None:  # step 0: every slot holds BOS alone; expand slot 0 only
            raw = torch.full((batch, width), float("-inf"), dtype=log_probs.dtype, device=device)  # (B, K)
            raw[:, 0] = 0.0
        lp_here = length_penalty_factor(t + 1, alpha)  # every new candidate has length t + 1
        # A live slot offers its V extensions; a finished one only itself, as a PAD "extension".
        extended = raw[:, :, None] + log_probs  # (B, K, V)
        finished_rank = raw / length_penalty_factor(lengths.to(raw.dtype), alpha)  # (B, K)
        cand_raw = torch.where(finished[:, :, None], _at_pad_only(raw, vocab, pad_id), extended)  # (B, K, V)
        cand_rank = torch.where(
            finished[:, :, None], _at_pad_only(finished_rank, vocab, pad_id), extended / lp_here
        )  # (B, K, V)

        _, top = cand_rank.view(batch, width * vocab).topk(width, dim=1)  # (B, K) into K*V
        origin = top // vocab  # (B, K)
        token = top % vocab  # (B, K)
        raw = cand_raw.view(batch, width * vocab).gather(1, top)  # (B, K)
        was_finished = finished.gather(1, origin)  # (B, K)
        token = token.masked_fill(was_finished, pad_id)
        ended = ~was_finished & (token == eos_id)  # (B, K)
        lengths = torch.where(ended, torch.full_like(lengths, t + 1), lengths.gather(1, origin))  # (B, K)
        finished = was_finished | ended

        rows = (origin + row_base).view(-1)  # (B*K,)
        state = select_state(new_state, rows)
        prev_tokens = token.view(-1)  # (B*K,)
        step_tokens.append(token)
        step_origins.append(origin)
        if weights is not None and keep_attention:
            chosen = weights.index_select(0, rows).view(batch, width, *weights.shape[1:])  # (B, K, H, T_enc)
            step_weights.append(chosen.masked_fill(was_finished[:, :, None, None], 0.0))

        # Stop an item once no live hypothesis can ever outrank its best finished one.
        lp_max = length_penalty_factor(max_length, alpha)
        finished_rank = raw / length_penalty_factor(lengths.to(raw.dtype), alpha)  # (B, K)
        best_finished = finished_rank.masked_fill(~finished, float("-inf")).amax(1)  # (B,)
        best_reachable = (raw / lp_max).masked_fill(finished, float("-inf")).amax(1)  # (B,)
        done = best_finished >= best_reachable  # (B,)
        raw = raw.masked_fill(done[:, None] & ~finished, float("-inf"))
        if (t + 1) % check_every == 0 and bool(done.all()):
            break

    assert raw is not None  # max_length >= 1
    # Hypotheses still live at max_length compete as they are, with length max_length.
    final_rank = raw / length_penalty_factor(lengths.to(raw.dtype), alpha)  # (B, K)
    slot = final_rank.argmax(1)  # (B,)
    scores = raw.gather(1, slot[:, None]).squeeze(1)  # (B,)
    best_lengths = lengths.gather(1, slot[:, None]).squeeze(1)  # (B,)

    # Follow the back-pointers from the chosen slot to step 0.
    steps = len(step_tokens)
    out_tokens: list[Tensor] = [torch.empty(0)] * steps
    out_weights: list[Tensor] = [torch.empty(0)] * steps
    items = torch.arange(batch, device=device)  # (B,)
    for t in reversed(range(steps)):
        out_tokens[t] = step_tokens[t][items, slot]  # (B,)
        if step_weights:
            out_weights[t] = step_weights[t][items, slot]  # (B, H, T_enc)
        slot = step_origins[t][items, slot]  # (B,)
    tokens = torch.stack(out_tokens, dim=1)  # (B, T_out)
    attention = torch.stack(out_weights, dim=2) if step_weights else None  # (B, H, T_out, T_enc)
    return BeamDecoded(tokens, best_lengths, attention, scores)


def _at_pad_only(values: Tensor, vocab: int, pad_id: int) -> Tensor:
    """``values (B, K)`` placed at the PAD column of a ``(B, K, V)`` tensor that is -inf elsewhere."""
    spread = values.new_full((*values.shape, vocab), float("-inf"))  # (B, K, V)
    spread[:, :, pad_id] = values
    return spread


def _pad_steps(decoded: BeamDecoded, steps: int) -> BeamDecoded:
    """Right-pad the time axis to ``steps`` (PAD tokens, zero attention)."""
    extra = steps - decoded.tokens.shape[1]
    if extra == 0:
        return decoded
    tokens = torch.nn.functional.pad(decoded.tokens, (0, extra), value=PAD)  # (B, steps)
    attention = decoded.attention
    if attention is not None:
        attention = torch.nn.functional.pad(attention, (0, 0, 0, extra))  # (B, H, steps, T_enc)
    return decoded._replace(tokens=tokens, attention=attention)


def _pick_better(beam: BeamDecoded, greedy: BeamDecoded, alpha: float) -> BeamDecoded:
    """Per item, the greedy hypothesis where it ranks strictly higher or is the same sequence."""
    steps = max(beam.tokens.shape[1], greedy.tokens.shape[1])
    beam, greedy = _pad_steps(beam, steps), _pad_steps(greedy, steps)
    greedy_scores = greedy.scores.to(beam.scores.dtype)  # (B,)
    beam_rank = beam.scores / length_penalty_factor(beam.lengths.to(beam.scores.dtype), alpha)  # (B,)
    greedy_rank = greedy_scores / length_penalty_factor(greedy.lengths.to(beam.scores.dtype), alpha)  # (B,)
    same = (beam.tokens == greedy.tokens).all(1) & (beam.lengths == greedy.lengths)  # (B,)
    use_greedy = same | (greedy_rank > beam_rank)  # (B,)
    tokens = torch.where(use_greedy[:, None], greedy.tokens, beam.tokens)  # (B, T_out)
    lengths = torch.where(use_greedy, greedy.lengths, beam.lengths)  # (B,)
    scores = torch.where(use_greedy, greedy_scores, beam.scores)  # (B,)
    attention = beam.attention
    if attention is not None and greedy.attention is not None:
        pick = use_greedy[:, None, None, None]  # (B, 1, 1, 1)
        attention = torch.where(pick, greedy.attention, beam.attention)  # (B, H, T_out, T_enc)
    return BeamDecoded(tokens, lengths, attention, scores)


def _trim(decoded: BeamDecoded) -> BeamDecoded:
    """Cut the time axis to the longest returned sequence."""
    steps = int(decoded.lengths.max())
    attention = None if decoded.attention is None else decoded.attention[:, :, :steps]  # (B, H, T_out, T_enc)
    return decoded._replace(tokens=decoded.tokens[:, :steps], attention=attention)  # (B, T_out)
