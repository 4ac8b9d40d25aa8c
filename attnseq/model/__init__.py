"""Encoders, decoders and the Seq2Seq model.

Names are imported on first use, so that the settings models (``attnseq.model.config``,
``encoders``, ``conventions``) are read without torch when the config is checked.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "BeamDecoded": "beam", "NBestDecoded": "beam", "beam_search": "beam", "beam_search_n_best": "beam",
    "sequence_log_prob": "beam", "ModelConfig": "config",
    "BahdanauDecoder": "decoders", "Decoder": "decoders", "LuongDecoder": "decoders", "PlainDecoder": "decoders",
    "Decoded": "decoding", "decode_length_limit": "decoding", "greedy_decode": "decoding",
    "RNNEncoder": "rnn_encoder", "load_model_file": "saved",
    "load_saved_model": "saved", "Seq2Seq": "seq2seq", "SelfAttention": "seq2seq", "build_seq2seq": "seq2seq",
    "decoder_inputs": "seq2seq", "DecoderState": "state",
    "Memory": "state", "SequenceDecoder": "decoders", "TransformerDecoder": "transformer_decoder",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"attnseq.model.{_HOMES[name]}"), name)
