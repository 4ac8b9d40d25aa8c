"""The fast paths: computations that give the model's own values and gradients with less work.

The model (``attnseq.model``) is written as the maths, one decoder step at a time; the code here
computes the same thing faster for training and is chosen by the model's construction switches.
Nothing here defines what the model computes: every kernel is tested against the step it
replaces (values and gradients), and ``FastPaths(False, False)`` turns them all off.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FastPaths:
    """Which fast paths a model built by ``build_seq2seq`` may take; all but ``lstm_sequence`` on by
    default (the defaults are the faster choice in benchmarks/results.md's "What was tried"; ``lstm_sequence``
    wins there on one processor, not on another).

    Switching one changes the speed only, never a value or a gradient (tested).
    """

    # teacher forcing through the fused recurrence; False = step by step (what decoding runs)
    fused_decoder: bool = True
    gru_sequence: bool = True  # whole-sequence GRU with the hand-written backward; False = torch.gru under autograd
    # whole-sequence LSTM with the hand-written backward (encoder, all-steps decoders); False = nn.LSTM under autograd.
    # Off by default: unlike the GRU's, it is faster on some processors and slower on others (docs/attention.md)
    lstm_sequence: bool = False
    # a one-layer LSTM encoder over a padded batch on CPU: torch's LSTM over the padded batch, one call per distinct
    # source length with the state carried between calls (unpacked, torch's fused CPU LSTM runs; packed, it does
    # not); False = packed sequences
    lstm_by_length: bool = True
    # Luong without input feeding, and the Transformer decoder's cross-attention: the additive/concat score of all
    # steps through kernels.additive_scores; False = the scorer's own all-steps score under autograd
    additive_all_steps: bool = True
    # Bahdanau, and Luong with input feeding, with a multiplicative score (dot, scaled dot, general): the recurrence
    # with its hand-written backward (kernels.multiplicative_recurrence, kernels.luong_recurrence); False = the
    # fused loop under autograd
    multiplicative_recurrence: bool = True


DEFAULT_FAST_PATHS = FastPaths()
"""The default of every ``fast_paths`` argument: every fast path that pays on by default."""

__all__ = ["DEFAULT_FAST_PATHS", "FastPaths"]
