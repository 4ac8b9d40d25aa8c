"""``model.init``: ``torch`` leaves every module's default, ``xavier`` draws JoeyNMT's recipe. The
drawn weights are checked against Glorot & Bengio's variance computed here from each matrix's shape
(an RNN's stacked gates counted as separate fan-outs), not against the code's own bound."""

from __future__ import annotations

import math
import typing

import pytest
import torch
from torch import nn

from attnseq.errors import ConfigError
from attnseq.model.config import InitScheme, ModelConfig
from attnseq.model.initialization import DRAWS
from attnseq.model.seq2seq import build_seq2seq

VOCAB = 400  # rows enough that a drawn matrix's spread is known to a few per cent
CASES = {  # label: ModelConfig keywords
    "bilstm/luong/general": dict(cell="lstm", bidirectional=True, scorer="general", decoder="luong"),
    "gru/bahdanau/additive": dict(cell="gru", scorer="additive", decoder="bahdanau"),
    "transformer/luong/dot, shared": dict(cell="gru", encoder="transformer", scorer="dot", decoder="luong",
                                          share_embeddings=True, tie_output=True),
}


def build(init: str, seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    return build_seq2seq(ModelConfig(VOCAB, VOCAB, embedding_dim=64, hidden_size=96, init=init, **kw))


def glorot_std(fan_in: int, fan_out: int) -> float:
    return math.sqrt(2.0 / (fan_in + fan_out))


@pytest.mark.parametrize("case", CASES)
def test_xavier_draws_joeynmts_recipe(case):
    model = build("xavier", **CASES[case])
    seen, drawn = 0, set()
    for module_name, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            where = f"{module_name}.{name}"
            if id(p) in drawn:  # a tied weight: checked as its first owner's
                continue
            drawn.add(id(p))
            if isinstance(module, nn.Embedding):
                rows = torch.ones(p.shape[0], dtype=torch.bool)
                rows[module.padding_idx] = False
                assert torch.all(p[module.padding_idx] == 0), where
                assert p[rows].std().item() == pytest.approx(0.1, rel=0.03), where
            elif name.startswith("bias"):
                assert torch.all(p == 0), where
            elif isinstance(module, nn.RNNBase):
                gates = {"LSTM": 4, "GRU": 3}[module.mode]
                want = glorot_std(p.shape[1], p.shape[0] // gates)  # each gate a (H, fan_in) matrix
                assert p.std().item() == pytest.approx(want, rel=0.05), where
                assert p.abs().max().item() <= math.sqrt(3) * want + 1e-6, where  # uniform, not normal
            elif p.dim() == 2:
                assert p.std().item() == pytest.approx(glorot_std(p.shape[1], p.shape[0]), rel=0.1), where
            else:
                continue
            seen += 1
    assert seen >= 8


def test_torch_scheme_is_the_modules_own_defaults():
    """``init=torch`` is the model as its modules drew it: LSTM biases nonzero, embeddings N(0, 1)."""
    model = build("torch", **CASES["bilstm/luong/general"])
    assert model.encoder.rnn.bias_ih_l0.abs().sum() > 0
    assert model.encoder.embedding.weight[1:].std().item() == pytest.approx(1.0, rel=0.03)


def test_the_draw_follows_the_seed_and_keeps_shared_weights_one():
    a, b, c = (build("xavier", seed=s, **CASES["transformer/luong/dot, shared"]) for s in (0, 0, 1))
    for (name, p), q, r in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(p, q), name
        if p.dim() == 2:
            assert not torch.equal(p, r), name
    assert a.decoder.embedding.weight is a.encoder.embedding.weight


def test_a_bad_scheme_names_the_key():
    with pytest.raises(ConfigError, match="model.init"):
        build("glorot", **CASES["gru/bahdanau/additive"])


def test_every_scheme_the_config_admits_has_a_draw():
    assert set(typing.get_args(InitScheme)) == set(DRAWS)
