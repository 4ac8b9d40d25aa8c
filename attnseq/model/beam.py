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

``beam_search_n_best`` returns the N ≤ K best hypotheses per item instead of the best alone, ranked
by the same score, with their raw log-probabilities and their ranking scores. Only the stop changes:
an item stops once its N-th best finished hypothesis ranks at least as high as any live one could
ever reach (the same bound), so none of its N best can change afterwards. With N = 1 it is
``beam_search`` exactly; with N > 1 its first hypothesis is ``beam_search``'s (barring two that rank
the same): a finished hypothesis keeps its slot while nothing can outrank it, however long the
search runs on. A wide enough beam is exhaustive here too: the N best of every output sequence.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnseq.data.vocab import BOS, EOS, PAD
from attnseq.model.decoding import Encoded
from attnseq.model.seq2seq import Seq2Seq
from attnseq.model.state import select_memory, select_state


class BeamDecoded(NamedTuple):
    tokens: Tensor  # (B, T_out): the output up to and including EOS, then PAD
    lengths: Tensor  # (B,): tokens up to and including EOS (max_length where no EOS came)
    attention: Tensor | None  # (B, H, T_out, T_enc); zeros after a sequence's EOS
    scores: Tensor  # (B,): raw model log-probability of ``tokens`` (EOS included), never length-normalised


class NBestDecoded(NamedTuple):
    """The N best hypotheses per item, best first. Where fewer than N exist (a beam wider than the
    target vocabulary on a very short output), the missing ones have ``scores`` and ``rank_scores``
    of -inf (``count`` leaves them out)."""

    tokens: Tensor  # (B, N, T_out): each hypothesis up to and including EOS, then PAD
    lengths: Tensor  # (B, N): tokens up to and including EOS (max_length where no EOS came)
    attention: Tensor | None  # (B, N, H, T_out, T_enc); zeros after a hypothesis's EOS
    scores: Tensor  # (B, N): raw model log-probability of each hypothesis (EOS included)
    rank_scores: Tensor  # (B, N): what ranked them, ``scores / lp(lengths)`` (= ``scores`` at α = 0)

    def best(self) -> BeamDecoded:
        """The first hypothesis of each item, as ``beam_search`` returns it (time axis trimmed)."""
        attention = None if self.attention is None else self.attention[:, 0]  # (B, H, T_out, T_enc)
        return _trim(BeamDecoded(self.tokens[:, 0], self.lengths[:, 0], attention, self.scores[:, 0]))  # (B, T_out)

    def count(self) -> list[int]:
        """How many hypotheses each item has (N, but for the -inf fillers)."""
        return torch.isfinite(self.scores).sum(1).tolist()


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
    stepwise: bool = False,
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
    also decodes greedily, as ``greedy_decode`` does, in the same steps (one more row per item beside
    its K, its log-probability summed as it goes) and returns, per item, whichever ranks higher (the
    greedy one when the two are the same sequence). The guarantee is thus one of this function, not
    of the search itself; it costs one row in K + 1 of every step. Under a length penalty the
    comparison uses the same penalised ranking.
    ``greedy_fallback=False`` returns the beam's own best, for studying the search alone.

    ``beam_size=1`` is greedy decoding exactly (tokens, lengths and attention; ``T_out`` as from
    ``greedy_decode(..., check_every=1)``, which may return extra PAD columns otherwise), barring
    two log-probabilities that round to the same value. As in greedy decoding, any id may be
    emitted before EOS, PAD/BOS/UNK included. Runs without gradients and changes nothing on the
    model; call it in eval mode. Whether all items have stopped is read back from the device only
    every ``check_every`` steps; that changes when the loop ends, never the result. ``encoded``:
    ``model.encode(src, src_lengths)`` when the caller has it; the search and the fallback share it.
    ``keep_attention=False``: no step's weights are kept (``attention`` is None; B·K·H·T_enc floats a step).
    Each step is the decoder's ``decoding_step`` over all B·K rows (``stepwise=True``: ``decoder.step``,
    as ``greedy_decode`` has it).
    """
    _check_arguments(beam_size, 1, max_length, length_penalty)
    encoded = encoded if encoded is not None else model.encode(src, src_lengths)
    found, greedy = _beam_core(model, encoded, beam_size, max_length, length_penalty, bos_id, eos_id, pad_id,
                               check_every, keep_attention, stepwise=stepwise,
                               with_greedy=greedy_fallback and beam_size > 1)
    best = _one(found)
    if greedy is not None:
        best = _pick_better(best, greedy, length_penalty)
    return _trim(best)


@torch.no_grad()
def beam_search_n_best(
    model: Seq2Seq,
    src: Tensor,
    src_lengths: Tensor,
    beam_size: int,
    n_best: int,
    max_length: int,
    length_penalty: float = 0.0,
    greedy_fallback: bool = True,
    bos_id: int = BOS,
    eos_id: int = EOS,
    pad_id: int = PAD,
    check_every: int = 4,
    encoded: Encoded | None = None,
    keep_attention: bool = True,
    stepwise: bool = False,
) -> NBestDecoded:
    """The ``n_best ≤ beam_size`` best hypotheses per item, best first (see the module docstring), ranked
    by ``log p / lp(length)`` with ``length_penalty=α`` (by ``log p`` at 0): ``tokens (B, N, T_out)``,
    ``lengths (B, N)``, ``attention (B, N, H, T_out, T_enc)`` (None without attention or with
    ``keep_attention=False``), ``scores (B, N)`` the raw log-probabilities and ``rank_scores (B, N)``
    the ranking ones. The other arguments are ``beam_search``'s.

    ``n_best=1`` is ``beam_search`` exactly. With ``greedy_fallback`` the first hypothesis is chosen as
    ``beam_search`` chooses it (the greedy output where that ranks higher), so it is
    ``beam_search``'s output; the greedy output joins the others where the beam does not hold it."""
    _check_arguments(beam_size, n_best, max_length, length_penalty)
    encoded = encoded if encoded is not None else model.encode(src, src_lengths)
    found, greedy = _beam_core(model, encoded, beam_size, max_length, length_penalty, bos_id, eos_id, pad_id,
                               check_every, keep_attention, n_best, stepwise,
                               with_greedy=greedy_fallback and beam_size > 1)
    if greedy is not None:
        found = _with_greedy(found, greedy, length_penalty)
    rank_scores = found.scores / length_penalty_factor(found.lengths.to(found.scores.dtype), length_penalty)  # (B, N)
    steps = int(found.lengths.max())
    attention = None if found.attention is None else found.attention[..., :steps, :]  # (B, N, H, T_out, T_enc)
    return NBestDecoded(found.tokens[..., :steps], found.lengths, attention, found.scores, rank_scores)  # (B, N, T_out)


def _check_arguments(beam_size: int, n_best: int, max_length: int, length_penalty: float) -> None:
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size={beam_size!r} must be a positive integer.")
    if not isinstance(n_best, int) or not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best={n_best!r} must be a whole number in [1, beam_size={beam_size}]: a beam of "
                         f"{beam_size} keeps {beam_size} hypotheses.")
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length={max_length!r} must be a positive integer.")
    if length_penalty < 0:
        raise ValueError(
            f"length_penalty={length_penalty!r} must be ≥ 0: the early stop relies on it (0 = no penalty)."
        )


def _one(found: BeamDecoded) -> BeamDecoded:
    """The n-best axis of ``_beam_core``'s output, of size 1, taken away."""
    attention = None if found.attention is None else found.attention[:, 0]  # (B, H, T_out, T_enc)
    return BeamDecoded(found.tokens[:, 0], found.lengths[:, 0], attention, found.scores[:, 0])  # (B, T_out)


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
    n_best: int = 1,
    stepwise: bool = False,
    with_greedy: bool = False,
) -> tuple[BeamDecoded, BeamDecoded | None]:
    """The beam search itself: its ``n_best`` best hypotheses per item, best first, as a ``BeamDecoded``
    with an n-best axis after the batch one (tokens ``(B, N, T_out)``, lengths and scores ``(B, N)``,
    attention ``(B, N, H, T_out, T_enc)``); the time axis runs over every step it ran.

    ``with_greedy``: also greedy decoding's output and its log-probability (``BeamDecoded`` without the
    n-best axis), decoded in the same steps as one more row per item (row b·(K+1) + K) that follows its own
    argmax as ``greedy_decode`` does, and alone where it runs on after the beam is done; else None. That
    costs less than a greedy decoding after the search and a teacher-forced pass to score it
    (``benchmarks/results.md``)."""
    memory, state = encoded
    device = memory.keys.device
    batch, width = memory.keys.shape[0], beam_size
    rows_per_item = width + 1 if with_greedy else width  # R
    expand = torch.arange(batch, device=device).repeat_interleave(rows_per_item)  # (B*R,): row b*R + k ← item b
    memory = select_memory(memory, expand)  # keys (B*R, T_enc, d_k)
    state = select_state(state, expand)  # rnn (L, B*R, d_s)
    step = model.decoder.decoding_step(memory, stepwise=stepwise)  # over all B*R rows
    row_base = (torch.arange(batch, device=device) * rows_per_item)[:, None]  # (B, 1)
    greedy = _GreedyRows(batch, max_length, row_base + width, eos_id, pad_id, keep_attention) if with_greedy else None

    prev_tokens = torch.full((batch * rows_per_item,), bos_id, dtype=torch.long, device=device)  # (B*R,)
    raw: Tensor | None = None  # (B, K): log p of each slot's hypothesis; dtype from the first step
    finished = torch.zeros(batch, width, dtype=torch.bool, device=device)  # (B, K)
    lengths = torch.full((batch, width), max_length, dtype=torch.long, device=device)  # (B, K)
    step_tokens: list[Tensor] = []  # per step (B, K): the token slot k took
    step_origins: list[Tensor] = []  # per step (B, K): the slot it came from at the step before
    step_weights: list[Tensor] = []  # per step (B, K, H, T_enc)

    for t in range(max_length):
        logits, weights, new_state = step(prev_tokens, state)  # (B*R, V), (B*R, H, T_enc)
        vocab = logits.shape[-1]
        every_log_prob = _log_probs(logits).view(batch, rows_per_item, vocab)  # (B, R, V)
        log_probs = every_log_prob[:, :width]  # (B, K, V)
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

        _, top = cand_rank.reshape(batch, width * vocab).topk(width, dim=1)  # (B, K) into K*V
        origin = top // vocab  # (B, K)
        token = top % vocab  # (B, K)
        raw = cand_raw.reshape(batch, width * vocab).gather(1, top)  # (B, K)
        was_finished = finished.gather(1, origin)  # (B, K)
        token = token.masked_fill(was_finished, pad_id)
        ended = ~was_finished & (token == eos_id)  # (B, K)
        lengths = torch.where(ended, torch.full_like(lengths, t + 1), lengths.gather(1, origin))  # (B, K)
        finished = was_finished | ended

        rows = origin + row_base  # (B, K)
        step_tokens.append(token)
        step_origins.append(origin)
        if weights is not None and keep_attention:
            chosen = weights.index_select(0, rows.view(-1)).view(batch, width, *weights.shape[1:])  # (B, K, H, T_enc)
            step_weights.append(chosen.masked_fill(was_finished[:, :, None, None], 0.0))
        if greedy is not None:
            own_weights = None if weights is None else weights.view(batch, rows_per_item, *weights.shape[1:])[:, width]
            greedy_token = greedy.step(t, logits.view(batch, rows_per_item, vocab)[:, width], every_log_prob[:, width],
                                       own_weights)  # (B,)
            rows = torch.cat([rows, greedy.rows], dim=1)  # (B, K+1): each greedy row stays where it is
            token = torch.cat([token, greedy_token[:, None]], dim=1)  # (B, K+1)
        state = select_state(new_state, rows.view(-1))
        prev_tokens = token.view(-1)  # (B*R,)

        # Stop an item once no live hypothesis can ever outrank its n_best-th best finished one.
        lp_max = length_penalty_factor(max_length, alpha)
        finished_rank = raw / length_penalty_factor(lengths.to(raw.dtype), alpha)  # (B, K)
        best_finished = finished_rank.masked_fill(~finished, float("-inf")).topk(n_best, 1).values[:, -1]  # (B,)
        best_reachable = (raw / lp_max).masked_fill(finished, float("-inf")).amax(1)  # (B,)
        done = best_finished >= best_reachable  # (B,)
        raw = raw.masked_fill(done[:, None] & ~finished, float("-inf"))
        if (t + 1) % check_every == 0 and bool(done.all()):
            break

    assert raw is not None  # max_length >= 1
    # Hypotheses still live at max_length compete as they are, with length max_length.
    final_rank = raw / length_penalty_factor(lengths.to(raw.dtype), alpha)  # (B, K)
    slot = final_rank.argmax(1, keepdim=True) if n_best == 1 else final_rank.topk(n_best, 1).indices  # (B, N)
    scores = raw.gather(1, slot)  # (B, N)
    best_lengths = lengths.gather(1, slot)  # (B, N)

    # Follow the back-pointers from the chosen slots to step 0.
    steps = len(step_tokens)
    out_tokens: list[Tensor] = [torch.empty(0)] * steps
    out_weights: list[Tensor] = [torch.empty(0)] * steps
    items = torch.arange(batch, device=device)[:, None]  # (B, 1)
    for t in reversed(range(steps)):
        out_tokens[t] = step_tokens[t][items, slot]  # (B, N)
        if step_weights:
            out_weights[t] = step_weights[t][items, slot]  # (B, N, H, T_enc)
        slot = step_origins[t][items, slot]  # (B, N)
    tokens = torch.stack(out_tokens, dim=2)  # (B, N, T_out)
    attention = torch.stack(out_weights, dim=3) if step_weights else None  # (B, N, H, T_out, T_enc)
    found = BeamDecoded(tokens, best_lengths, attention, scores)
    if greedy is None:
        return found, None
    if steps < max_length and not bool(greedy.finished.all()):
        # Greedy rows still running when the beam is done go on alone, B rows instead of B·(K+1).
        alone = greedy.rows.view(-1)  # (B,)
        greedy_step = model.decoder.decoding_step(select_memory(memory, alone), stepwise=stepwise)
        greedy_state, greedy_tokens = select_state(state, alone), prev_tokens.index_select(0, alone)  # (B,)
        for t in range(steps, max_length):
            logits, weights, greedy_state = greedy_step(greedy_tokens, greedy_state)  # (B, V), (B, H, T_enc)
            greedy_tokens = greedy.step(t, logits, _log_probs(logits), weights)  # (B,)
            if (t + 1 - steps) % check_every == 0 and bool(greedy.finished.all()):
                break
    return found, greedy.decoded()


class _GreedyRows:
    """The greedy row of each item inside a beam search's batch: its argmax at each step, as ``greedy_decode``
    takes it (PAD after EOS; length ``max_length`` where no EOS came), the log-probabilities of its tokens up
    to and including EOS summed as it goes, and its weights where they are kept (zeros after EOS)."""

    def __init__(self, batch: int, max_length: int, rows: Tensor, eos_id: int, pad_id: int,
                 keep_attention: bool) -> None:
        self.rows = rows  # (B, 1): where each item's greedy row lies in the batch
        self.eos_id, self.pad_id, self.keep_attention = eos_id, pad_id, keep_attention
        device = rows.device
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
        self.lengths = torch.full((batch,), max_length, dtype=torch.long, device=device)  # (B,)
        self.tokens = torch.full((batch, max_length), pad_id, dtype=torch.long, device=device)  # (B, max_length)
        self.scores: Tensor | None = None  # (B,), in the log-probabilities' dtype
        self.weights: list[Tensor] = []  # per step (B, H, T_enc)
        self.steps = 0

    def step(self, t: int, logits: Tensor, log_probs: Tensor, weights: Tensor | None) -> Tensor:
        """Step ``t`` from the greedy rows' logits, log-probabilities ``(B, V)`` and weights ``(B, H, T_enc)``:
        the tokens ``(B,)`` the rows read next."""
        token = logits.argmax(-1).masked_fill_(self.finished, self.pad_id)  # (B,)
        self.tokens[:, t] = token
        self.steps = t + 1
        taken = log_probs.gather(1, token[:, None]).squeeze(1).masked_fill(self.finished, 0.0)  # (B,)
        self.scores = taken if self.scores is None else self.scores + taken
        if weights is not None and self.keep_attention:
            self.weights.append(weights.masked_fill(self.finished[:, None, None], 0.0))  # (B, H, T_enc)
        just_ended = (token == self.eos_id) & ~self.finished  # (B,)
        self.lengths.masked_fill_(just_ended, t + 1)
        self.finished |= just_ended
        return token

    def decoded(self) -> BeamDecoded:
        """The output over the steps run, with its log-probability."""
        assert self.scores is not None  # at least one step ran
        attention = torch.stack(self.weights, dim=2) if self.weights else None  # (B, H, T_out, T_enc)
        return BeamDecoded(self.tokens[:, : self.steps], self.lengths, attention, self.scores)  # (B, T_out)


def _at_pad_only(values: Tensor, vocab: int, pad_id: int) -> Tensor:
    """``values (B, K)`` placed at the PAD column of a ``(B, K, V)`` tensor that is -inf elsewhere."""
    spread = values.new_full((*values.shape, vocab), float("-inf"))  # (B, K, V)
    spread[:, :, pad_id] = values
    return spread


def _pad_steps(decoded: BeamDecoded, steps: int) -> BeamDecoded:
    """Right-pad the time axis to ``steps`` (PAD tokens, zero attention), with or without an n-best axis."""
    extra = steps - decoded.tokens.shape[-1]
    if extra == 0:
        return decoded
    tokens = torch.nn.functional.pad(decoded.tokens, (0, extra), value=PAD)  # (B, [N,] steps)
    attention = decoded.attention
    if attention is not None:
        attention = torch.nn.functional.pad(attention, (0, 0, 0, extra))  # (B, [N,] H, steps, T_enc)
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


def _with_greedy(found: BeamDecoded, greedy: BeamDecoded, alpha: float) -> BeamDecoded:
    """The beam's n best (``_beam_core``'s, with the n-best axis) and the greedy output: first what
    ``_pick_better`` picks from the beam's best and greedy's, then the rest of the beam's and the greedy
    one (where the beam does not hold it) by rank. The top one's other copy is dropped."""
    n_best = found.tokens.shape[1]
    steps = max(found.tokens.shape[-1], greedy.tokens.shape[-1])
    found, greedy = _pad_steps(found, steps), _pad_steps(greedy, steps)
    top = _pick_better(_one(found), greedy, alpha)  # exactly beam_search's choice
    if n_best == 1:
        attention = None if top.attention is None else top.attention[:, None]  # (B, 1, H, T_out, T_enc)
        return BeamDecoded(top.tokens[:, None], top.lengths[:, None], attention, top.scores[:, None])  # (B, 1, T_out)
    tokens = torch.cat([found.tokens, greedy.tokens[:, None]], dim=1)  # (B, N + 1, T_out)
    lengths = torch.cat([found.lengths, greedy.lengths[:, None]], dim=1)  # (B, N + 1)
    scores = torch.cat([found.scores, greedy.scores.to(found.scores.dtype)[:, None]], dim=1)  # (B, N + 1)

    def same(a: Tensor, a_lengths: Tensor, b: Tensor, b_lengths: Tensor) -> Tensor:
        return (a == b).all(-1) & (a_lengths == b_lengths)

    drop = same(tokens, lengths, top.tokens[:, None], top.lengths[:, None])  # (B, N + 1)
    greedy_held = same(found.tokens, found.lengths, greedy.tokens[:, None], greedy.lengths[:, None]).any(1)  # (B,)
    drop[:, -1] |= greedy_held
    scores = scores.masked_fill(drop, float("-inf"))  # a dropped copy is no hypothesis
    rank = scores / length_penalty_factor(lengths.to(scores.dtype), alpha)  # (B, N + 1)
    rest = rank.argsort(dim=1, descending=True, stable=True)[:, : n_best - 1]  # (B, N - 1)
    items = torch.arange(tokens.shape[0], device=tokens.device)[:, None]  # (B, 1)
    attention = None
    if found.attention is not None and greedy.attention is not None and top.attention is not None:
        every = torch.cat([found.attention, greedy.attention[:, None]], dim=1)  # (B, N + 1, H, T_out, T_enc)
        attention = torch.cat([top.attention[:, None], every[items, rest]], dim=1)  # (B, N, H, T_out, T_enc)
    return BeamDecoded(
        torch.cat([top.tokens[:, None], tokens[items, rest]], dim=1),  # (B, N, T_out)
        torch.cat([top.lengths[:, None], lengths[items, rest]], dim=1),  # (B, N)
        attention,
        torch.cat([top.scores.to(scores.dtype)[:, None], scores[items, rest]], dim=1),  # (B, N)
    )


def _trim(decoded: BeamDecoded) -> BeamDecoded:
    """Cut the time axis to the longest returned sequence."""
    steps = int(decoded.lengths.max())
    attention = None if decoded.attention is None else decoded.attention[:, :, :steps]  # (B, H, T_out, T_enc)
    return decoded._replace(tokens=decoded.tokens[:, :steps], attention=attention)  # (B, T_out)
