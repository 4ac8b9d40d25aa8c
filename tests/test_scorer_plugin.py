"""A scorer is one class and one ``conf/scorer/<name>.yaml``: a new one, defined here outside the
package, registers itself, trains through the real CLI, and computes the same scores teacher-forced
as step by step under both decoder conventions. A fused kernel is taken only where the scorer
declares it, never because of subclassing."""

from __future__ import annotations

import os
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch
from cli_helpers import all_runs, clean_env, explain, outputs_under, run_cli, tiny  # noqa: E402
from mlflow.tracking import MlflowClient
from model_checks import assert_same_outputs_and_gradients, forward_and_gradients

from attnseq.attention import SCORERS, AdditiveAttention, Attention, build_attention, lengths_to_valid_mask
from attnseq.errors import ConfigError
from attnseq.model import ModelConfig, build_seq2seq

V = 11

# e_{t,i} = vᵀ tanh((W_q s) ⊙ (U h_i)) per head: a bilinear form squashed by tanh, then weighed.
PLUGIN_SOURCE = '''
import math

import torch
from pydantic import PositiveInt
from torch import nn

from attnseq.attention import Attention
from attnseq.attention.settings import ScorerSettings


class BilinearTanhAttention(Attention):
    """e = vᵀ tanh((W_q s) ⊙ (U h)); head h owns the h-th row block of W_q, U and v."""

    name = "{name}"

    class Settings(ScorerSettings):
        attn_dim: PositiveInt | None = None

    def __init__(self, query_dim, key_dim, heads=1, attn_dim=None):
        super().__init__(query_dim, key_dim, heads)
        self.attn_dim = key_dim if attn_dim is None else attn_dim
        self.head_attn_dim = self.attn_dim // heads
        bound = 1 / math.sqrt(query_dim)
        self.W_q = nn.Parameter(torch.empty(self.attn_dim, query_dim).uniform_(-bound, bound))
        self.U = nn.Parameter(torch.empty(self.attn_dim, self.head_dim).uniform_(-1, 1))
        self.v = nn.Parameter(torch.empty(self.attn_dim).uniform_(-1, 1))

    def query_weight(self):
        return self.W_q

    def project_keys(self, keys):
        blocks = self.U.view(self.heads, self.head_attn_dim, self.head_dim)
        return torch.einsum("bhtd,had->bhta", self.split_heads(keys), blocks)

    def split_query(self, query):
        batch, steps, _ = query.shape
        return query.view(batch, steps, self.heads, self.head_attn_dim).transpose(1, 2)

    def score_projected(self, projected_query, projected_keys):
        hidden = torch.tanh(projected_query.unsqueeze(3) * projected_keys.unsqueeze(2))
        return torch.einsum("bhsta,ha->bhst", hidden, self.v.view(self.heads, self.head_attn_dim))
'''


@pytest.fixture
def registry():
    """The registry as it was before the test: scorers defined by a test leave with it."""
    saved = dict(SCORERS)
    yield SCORERS
    SCORERS.clear()
    SCORERS.update(saved)


@pytest.fixture
def plugin(tmp_path, registry, monkeypatch):
    """A module defining a new scorer, importable from ``tmp_path``, and its config file under
    ``tmp_path/conf/scorer/``. Returns (module name, scorer name)."""
    tag = uuid.uuid4().hex[:8]
    module, name = f"my_scorers_{tag}", f"bilinear_tanh_{tag}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(PLUGIN_SOURCE.format(name=name)))
    (tmp_path / "conf" / "scorer").mkdir(parents=True)
    (tmp_path / "conf" / "scorer" / f"{name}.yaml").write_text(
        f"# e = v^T tanh((W_q s) * (U h)), defined outside attnseq.\nname: {name}\nattn_dim: 8\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module, name
    sys.modules.pop(module, None)


def make_batch():
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([6, 3, 1, 4])
    src = torch.randint(4, V, (4, 6), generator=gen).masked_fill(~lengths_to_valid_mask(lengths), 0)
    tgt_in = torch.randint(3, V, (4, 5), generator=gen)
    tgt_in[:, 0] = 1
    return src, lengths, tgt_in


def teacher_forced_and_stepped(model):
    """``model(...)`` (full teacher forcing, the fast path) and ``decoder.step`` by step on the
    same batch: each as logits, weights and parameter gradients."""
    return forward_and_gradients(model, *make_batch())


DECODERS = {
    "bahdanau": dict(decoder="bahdanau"),
    "luong": dict(decoder="luong", input_feeding=True),
    "luong-nofeed": dict(decoder="luong", input_feeding=False),
}


# ---------------------------------------------------------------------------------- a new scorer
def test_a_new_scorer_registers_and_scores_by_its_own_formula(plugin):
    module, name = plugin
    __import__(module)
    assert name in SCORERS and SCORERS[name].Settings(name=name).model_dump() == {"name": name, "attn_dim": None}
    assert SCORERS[name].fused_recurrence is None and not SCORERS[name].same_size
    torch.manual_seed(0)
    attention = build_attention(name, 6, 8, heads=2, attn_dim=4).double()
    query = torch.randn(3, 2, 6, dtype=torch.float64)
    keys = torch.randn(3, 5, 8, dtype=torch.float64)
    valid = lengths_to_valid_mask(torch.tensor([5, 2, 4]), 5)
    _, weights = attention(query, keys, valid)  # (B, H, T_dec, T_enc)
    W_q, U, v = attention.W_q.detach(), attention.U.detach(), attention.v.detach()
    for b in range(3):  # the formula, one head and one key at a time
        for t in range(2):
            for h in range(2):
                rows, cols = slice(2 * h, 2 * h + 2), slice(4 * h, 4 * h + 4)
                n = int(valid[b].sum())
                scores = torch.stack(
                    [v[rows] @ torch.tanh((W_q[rows] @ query[b, t]) * (U[rows] @ keys[b, i, cols])) for i in range(n)]
                )
                torch.testing.assert_close(weights[b, h, t, :n], scores.softmax(-1))
                assert torch.all(weights[b, h, t, n:] == 0)


@pytest.mark.parametrize("dec", DECODERS)
@pytest.mark.parametrize("heads", [1, 2])
def test_a_new_scorer_teacher_forced_equals_step_by_step(plugin, dec, heads):
    module, name = plugin
    torch.manual_seed(0)
    config = ModelConfig(
        V, V, embedding_dim=8, hidden_size=12, scorer=name, scorer_options={"attn_dim": 6}, heads=heads,
        plugins=(module,), **DECODERS[dec],
    )
    model = build_seq2seq(config).double().train()
    assert model.decoder.takes_fast_path()
    assert_same_outputs_and_gradients(*teacher_forced_and_stepped(model))


@pytest.mark.slow
def test_a_new_scorer_trains_through_the_cli_and_its_saved_model_loads_again(plugin, tmp_path):
    from attnseq.model import load_model_file

    module, name = plugin
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    proc = run_cli(
        tmp_path,
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        f"scorer={name}",
        f"plugins=[{module}]",
        *tiny(max_epochs=1, heatmaps=False),
        *outputs_under(tmp_path, seeded=True),
        env=env,
    )
    assert proc.returncode == 0, explain(proc)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = all_runs(client)
    assert run.info.status == "FINISHED"
    assert run.data.params["scorer.name"] == name and run.data.params["scorer.attn_dim"] == "8"
    saved = load_model_file(Path(client.download_artifacts(run.info.run_id, "weights/model.pt", str(tmp_path / "dl"))))
    __import__(module)  # a saved model's plugins are imported on request only
    config = ModelConfig.from_saved(saved["model_config"])
    assert config.scorer == name and config.scorer_options == {"attn_dim": 8} and config.plugins == (module,)
    model = build_seq2seq(config)
    model.load_state_dict(saved["state_dict"], strict=True)
    assert type(model.attention).name == name and model.attention.attn_dim == 8


def test_an_unknown_scorer_option_names_its_key(plugin):
    module, name = plugin
    config = ModelConfig(V, V, scorer=name, scorer_options={"attn_size": 8}, plugins=(module,))
    with pytest.raises(ConfigError) as caught:
        build_seq2seq(config)
    assert "scorer.attn_size" in str(caught.value) and "scorer.attn_dim" in str(caught.value)


# ---------------------------------------------------------------------------------- declarations
def test_a_subclass_of_additive_with_another_score_does_not_take_the_additive_kernel(registry):
    class CubedAdditive(AdditiveAttention):
        """e = v_aᵀ tanh(W_a s + U_a h)³: the additive parameters, another score."""

        name = "cubed_additive"

        def score_projected(self, projected_query, projected_keys):
            hidden = torch.tanh(
                projected_query.unsqueeze(3) + projected_keys.unsqueeze(2)
            ) ** 3  # (B, H, T_dec, T_enc, a)
            return torch.einsum("bhsta,ha->bhst", hidden, self.v_a.view(self.heads, -1))  # (B, H, T_dec, T_enc)

    assert CubedAdditive.fused_recurrence is None and AdditiveAttention.fused_recurrence == "additive"
    # the settings are inherited, the kernel is not
    assert set(CubedAdditive.Settings.model_fields) == set(AdditiveAttention.Settings.model_fields)
    for heads in (1, 2):
        torch.manual_seed(0)
        model = build_seq2seq(ModelConfig(V, V, embedding_dim=8, hidden_size=12, scorer="cubed_additive", heads=heads))
        model = model.double().train()
        fast, reference = teacher_forced_and_stepped(model)
        assert "AdditiveGRURecurrence" not in str(fast[1].grad_fn) and fast[1].grad_fn is not None
        assert_same_outputs_and_gradients(fast, reference)
        additive = AdditiveAttention(12, 12, heads=heads).double()  # the same parameters, the additive score
        additive.load_state_dict(model.attention.state_dict())
        src, lengths, _ = make_batch()
        memory, state = model.encode(src, lengths)
        query = state.rnn[-1]  # (B, d_s)
        _, cubed_weights = model.attention(query, memory.keys, memory.valid_mask)
        _, additive_weights = additive(query, memory.keys, memory.valid_mask)
        assert not torch.allclose(cubed_weights, additive_weights)  # the kernel would have been wrong


def test_the_additive_scorers_take_the_additive_kernel():
    torch.manual_seed(0)
    for name, cls in SCORERS.items():
        if cls.fused_recurrence == "additive":
            model = build_seq2seq(ModelConfig(V, V, embedding_dim=8, hidden_size=12, scorer=name)).train()
            src, lengths, tgt_in = make_batch()
            _, weights = model(src, lengths, tgt_in)
            assert "AdditiveGRURecurrence" in str(weights.grad_fn), name


def test_a_scorer_defines_its_parts_not_forward(registry):
    with pytest.raises(TypeError, match="overrides Attention.forward"):

        class Sneaky(Attention):
            name = "sneaky"

            def forward(self, query, keys, valid_mask, projected_keys=None):
                raise AssertionError

    assert "sneaky" not in SCORERS


def test_a_taken_name_is_refused(registry):
    with pytest.raises(TypeError, match="taken"):

        class AnotherAdditive(AdditiveAttention):
            name = "additive"
