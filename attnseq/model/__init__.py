"""Encoders, decoders and the Seq2Seq model."""

from attnseq.model.beam import BeamDecoded, beam_search, sequence_log_prob
from attnseq.model.config import ModelConfig
from attnseq.model.decoders import BahdanauDecoder, Decoder, LuongDecoder, PlainDecoder
from attnseq.model.decoding import Decoded, decode_length_limit, greedy_decode
from attnseq.model.encoder import RNNEncoder
from attnseq.model.saved import load_model_file, load_saved_model
from attnseq.model.seq2seq import Seq2Seq, build_seq2seq
from attnseq.model.state import DecoderState, Memory

__all__ = [
    "BahdanauDecoder",
    "BeamDecoded",
    "Decoded",
    "Decoder",
    "DecoderState",
    "LuongDecoder",
    "Memory",
    "ModelConfig",
    "PlainDecoder",
    "RNNEncoder",
    "Seq2Seq",
    "beam_search",
    "build_seq2seq",
    "decode_length_limit",
    "greedy_decode",
    "load_model_file",
    "load_saved_model",
    "sequence_log_prob",
]
