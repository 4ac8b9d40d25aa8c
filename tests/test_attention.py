"""Every scorer against an independent NumPy computation, masking, multi-head, shape errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnseq.attention import SCORERS, build_attention, lengths_to_valid_mask, masked_softmax
from attnseq.errors import ConfigError, ShapeError

SCORER_NAMES = sorted(SCORERS)
SAME_SIZE = [name for name in SCORER_NAMES if SCORERS[name].same_size]
ANY_SIZES = [name for name in SCORER_NAMES if not SCORERS[name].same_size]
KEY_SLICES = [name for name in SCORER_NAMES if SCORERS[name].values_are_keys]
"""Scorers whose heads each score and average their own slice of the keys (multihead's heads
project the whole keys instead: tests/test_multihead.py)."""


def sized(scorer: str, attn_dim: int) -> dict:
    """The options that set the attention size, for a scorer that takes one."""
    return {"attn_dim": attn_dim} if "attn_dim" in SCORERS[scorer].Settings.model_fields else {}


def reference_scores(scorer: str, params: dict, heads: int, q: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Plain loops over heads and key positions, straight from the formulas in docs/attention.md.

    q: (d_q,), keys: (T_enc, d_k) → scores (H, T_enc).
    """
    d_k = keys.shape[1]
    d_h = d_k // heads
    out = np.zeros((heads, keys.shape[0]))
    if scorer == "multihead":  # q = W_Q s + b_Q, k_i = W_K h_i, each head on its slice of d_m
        projected_query = params["W_Q.weight"] @ q + params["W_Q.bias"]
        d_p = projected_query.shape[0] // heads
        for h in range(heads):
            rows = slice(h * d_p, (h + 1) * d_p)
            for i, key in enumerate(keys):
                out[h, i] = projected_query[rows] @ (params["W_K.weight"][rows] @ key) / math.sqrt(d_p)
        return out
    for h in range(heads):
        cols = slice(h * d_h, (h + 1) * d_h)
        for i, key in enumerate(keys):
            k = key[cols]
            if scorer == "dot":
                out[h, i] = q[cols] @ k
            elif scorer == "scaled_dot":
                out[h, i] = q[cols] @ k / math.sqrt(d_h)
            elif scorer == "general":
                out[h, i] = q @ (params["W"][:, cols] @ k)
            elif scorer == "uniform":
                out[h, i] = 0.0
            elif scorer in ("additive", "concat"):
                a = params["v_a"].shape[0] // heads
                rows = slice(h * a, (h + 1) * a)
                if scorer == "additive":
                    pre = params["W_a"][rows] @ q + params["U_a"][rows] @ k
                else:
                    pre = params["W_a"][rows] @ np.concatenate([q, k])
                out[h, i] = params["v_a"][rows] @ np.tanh(pre)
            else:
                raise NotImplementedError(f"no reference formula for scorer {scorer!r}: write its score here")
    return out


def reference_attention(scorer, params, heads, q, keys, valid):
    """One query (d_q,) → context (d_k,), weights (H, T_enc); softmax over valid positions only."""
    scores = reference_scores(scorer, params, heads, q, keys)
    weights = np.zeros_like(scores)
    d_h = keys.shape[1] // heads
    context = np.zeros(keys.shape[1])
    idx = np.flatnonzero(valid)
    for h in range(heads):
        if len(idx):
            e = np.exp(scores[h, idx] - scores[h, idx].max())
            weights[h, idx] = e / e.sum()
        context[h * d_h : (h + 1) * d_h] = weights[h] @ keys[:, h * d_h : (h + 1) * d_h]
    if scorer == "multihead":  # values v_i = W_V h_i + b_V, heads' averages through W_O
        values = keys @ params["W_V.weight"].T + params["W_V.bias"]  # (T_enc, d_m)
        d_p = values.shape[1] // heads
        averaged = np.concatenate([weights[h] @ values[:, h * d_p : (h + 1) * d_p] for h in range(heads)])
        context = params["W_O.weight"] @ averaged + params["W_O.bias"] if len(idx) else np.zeros(keys.shape[1])
    return context, weights


def make_inputs(batch, t_dec, t_enc, d, seed):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, t_dec, d, generator=gen, dtype=torch.float64)
    keys = torch.randn(batch, t_enc, d, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, t_enc + 1, (batch,), generator=gen)
    lengths[0] = t_enc  # at least one full row
    return query, keys, lengths_to_valid_mask(lengths, t_enc)


@pytest.mark.parametrize("scorer", SCORER_NAMES)
@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("batch,t_dec,t_enc,d", [(1, 1, 1, 8), (3, 4, 7, 8), (2, 5, 3, 16)])
def test_scorer_matches_independent_computation(scorer, heads, batch, t_dec, t_enc, d):
    torch.manual_seed(0)
    attention = build_attention(scorer, d, d, heads=heads, **sized(scorer, 2 * d)).double()
    query, keys, valid = make_inputs(batch, t_dec, t_enc, d, seed=batch * 100 + t_enc)
    params = {name: p.detach().numpy() for name, p in attention.named_parameters()}

    context, weights = attention(query, keys, valid)  # all steps at once
    assert context.shape == (batch, t_dec, d)
    assert weights.shape == (batch, heads, t_dec, t_enc)
    for b in range(batch):
        for t in range(t_dec):
            ref_context, ref_weights = reference_attention(
                scorer, params, heads, query[b, t].numpy(), keys[b].numpy(), valid[b].numpy()
            )
            np.testing.assert_allclose(weights[b, :, t].detach().numpy(), ref_weights, atol=1e-10)
            np.testing.assert_allclose(context[b, t].detach().numpy(), ref_context, atol=1e-10)

    # one decoder step: (B, d_q) → (B, d_k), (B, H, T_enc), the same numbers as step 0 above
    step_context, step_weights = attention(query[:, 0], keys, valid)
    assert step_context.shape == (batch, d) and step_weights.shape == (batch, heads, t_enc)
    torch.testing.assert_close(step_context, context[:, 0])
    torch.testing.assert_close(step_weights, weights[:, :, 0])


@pytest.mark.parametrize("scorer", ANY_SIZES)
def test_query_and_key_sizes_may_differ_where_the_maths_allows(scorer):
    attention = build_attention(scorer, query_dim=6, key_dim=10, heads=2, **sized(scorer, 4)).double()
    query, keys, valid = make_inputs(2, 3, 5, 10, seed=1)
    query = query[..., :6].contiguous()
    params = {name: p.detach().numpy() for name, p in attention.named_parameters()}
    context, weights = attention(query, keys, valid)
    ref_context, ref_weights = reference_attention(
        scorer, params, 2, query[1, 2].numpy(), keys[1].numpy(), valid[1].numpy()
    )
    np.testing.assert_allclose(weights[1, :, 2].detach().numpy(), ref_weights, atol=1e-10)
    np.testing.assert_allclose(context[1, 2].detach().numpy(), ref_context, atol=1e-10)


@pytest.mark.parametrize("scorer", KEY_SLICES)
@pytest.mark.parametrize("heads", [2, 4])
def test_multi_head_equals_single_heads_on_slices(scorer, heads):
    """Each head is a single-head mechanism on its slice of the keys, with its own parameters."""
    d, a = 16, 8
    multi = build_attention(scorer, d, d, heads=heads, **sized(scorer, a * heads)).double()
    query, keys, valid = make_inputs(3, 4, 6, d, seed=heads)
    context, weights = multi(query, keys, valid)
    d_h = d // heads
    for h in range(heads):
        cols = slice(h * d_h, (h + 1) * d_h)
        key_slice = keys[..., cols]
        if SCORERS[scorer].same_size:
            single = build_attention(scorer, d_h, d_h).double()
            head_query = query[..., cols]
        elif not SCORERS[scorer].content_based:  # uniform: nothing to copy
            single = build_attention(scorer, d, d_h).double()
            head_query = query
        elif scorer == "general":
            single = build_attention(scorer, d, d_h).double()
            single.W.data.copy_(multi.W.data[:, cols])
            head_query = query
        else:
            single = build_attention(scorer, d, d_h, attn_dim=a).double()
            rows = slice(h * a, (h + 1) * a)
            single.W_a.data.copy_(multi.W_a.data[rows])
            single.v_a.data.copy_(multi.v_a.data[rows])
            if scorer == "additive":
                single.U_a.data.copy_(multi.U_a.data[rows])
            head_query = query
        head_context, head_weights = single(head_query, key_slice, valid)
        torch.testing.assert_close(weights[:, h : h + 1], head_weights)
        torch.testing.assert_close(context[..., cols], head_context)


@pytest.mark.parametrize("scorer", ["general", "additive"])
def test_one_head_is_exactly_the_single_head_formula(scorer):
    """heads=1 uses the full-size parameters of docs/attention.md: W (d_q, d_k), U_a (d_attn, d_k)."""
    attention = build_attention(scorer, 5, 7, heads=1, **sized(scorer, 3)).double()
    if scorer == "general":
        assert attention.W.shape == (5, 7)
    else:
        assert (attention.W_a.shape, attention.U_a.shape, attention.v_a.shape) == ((3, 5), (3, 7), (3,))
    query, keys, valid = make_inputs(2, 1, 4, 7, seed=3)
    query = query[..., :5].contiguous()
    scores = attention.score(query, attention.project_keys(keys))  # (B, 1, 1, T_enc)
    W = {n: p.detach() for n, p in attention.named_parameters()}
    for b in range(2):
        for i in range(4):
            s, h = query[b, 0], keys[b, i]
            expected = s @ W["W"] @ h if scorer == "general" else W["v_a"] @ torch.tanh(W["W_a"] @ s + W["U_a"] @ h)
            torch.testing.assert_close(scores[b, 0, 0, i], expected)


@pytest.mark.parametrize("scorer", SCORER_NAMES)
@pytest.mark.parametrize("heads", [1, 2])
def test_weights_sum_to_one_and_padding_gets_exactly_zero(scorer, heads):
    attention = build_attention(scorer, 8, 8, heads=heads)
    query, keys, _ = make_inputs(4, 3, 9, 8, seed=7)
    lengths = torch.tensor([9, 5, 1, 0])
    valid = lengths_to_valid_mask(lengths, 9)
    context, weights = attention(query.float(), keys.float(), valid)
    sums = weights.sum(-1)  # (B, H, T_dec)
    torch.testing.assert_close(sums[:3], torch.ones_like(sums[:3]))
    assert torch.all(weights[1, ..., 5:] == 0)
    assert torch.all(weights[2, ..., 1:] == 0)
    # a row with no valid position: zeros, never NaN
    assert torch.all(weights[3] == 0) and torch.all(context[3] == 0)
    assert torch.isfinite(weights).all() and torch.isfinite(context).all()


def test_padding_content_does_not_change_the_result():
    attention = build_attention("additive", 8, 8, heads=2)
    query, keys, _ = make_inputs(2, 3, 6, 8, seed=11)
    query, keys = query.float(), keys.float()
    valid = lengths_to_valid_mask(torch.tensor([6, 2]), 6)
    context, weights = attention(query, keys, valid)
    noisy = keys.clone()
    noisy[1, 2:] = 1e4  # garbage in the padded positions
    context2, weights2 = attention(query, noisy, valid)
    torch.testing.assert_close(context, context2)
    torch.testing.assert_close(weights, weights2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_masked_softmax_is_safe_in_half_precision(dtype):
    scores = torch.tensor([[30000.0, -30000.0, 5.0], [1.0, 2.0, 3.0]], dtype=dtype)
    valid = torch.tensor([[True, True, False], [False, False, False]])
    weights = masked_softmax(scores, valid)
    assert weights.dtype == dtype
    assert torch.isfinite(weights).all()
    assert weights[0, 2] == 0 and torch.all(weights[1] == 0)
    assert weights[0].sum().item() == pytest.approx(1.0, abs=1e-2)


@pytest.mark.parametrize("scorer", SCORER_NAMES)
def test_gradients_reach_every_parameter(scorer):
    attention = build_attention(scorer, 8, 8, heads=2)
    query, keys, valid = make_inputs(2, 3, 5, 8, seed=5)
    query, keys = query.float().requires_grad_(), keys.float().requires_grad_()
    context, _ = attention(query, keys, valid)
    context.square().sum().backward()
    for name, p in attention.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert keys.grad.abs().sum() > 0
    if SCORERS[scorer].content_based:
        assert query.grad.abs().sum() > 0
    else:  # uniform: the weights never read the query
        assert query.grad is None or torch.all(query.grad == 0)


@pytest.mark.parametrize("heads", [1, 2])
def test_uniform_weights_are_one_over_the_length_and_the_context_the_mean_of_the_real_states(heads):
    """Wiegreffe & Pinter's baseline, computed here without the softmax: 1/len on the real positions,
    0 on padding, whatever the query; the context is the plain mean of the real encoder states."""
    attention = build_attention("uniform", 6, 8, heads=heads).double()
    assert not list(attention.parameters())
    gen = torch.Generator().manual_seed(heads)
    query = torch.randn(4, 3, 6, generator=gen, dtype=torch.float64)
    keys = torch.randn(4, 7, 8, generator=gen, dtype=torch.float64)
    lengths = [7, 4, 1, 2]
    valid = torch.tensor([[i < n for i in range(7)] for n in lengths])
    context, weights = attention(query, keys, valid)
    assert weights.shape == (4, heads, 3, 7) and context.shape == (4, 3, 8)
    for b, n in enumerate(lengths):
        expected = [1.0 / n] * n + [0.0] * (7 - n)
        for h in range(heads):
            for t in range(3):
                assert weights[b, h, t].tolist() == pytest.approx(expected, abs=1e-15)
                assert weights[b, h, t, n:].tolist() == [0.0] * (7 - n)  # exactly zero on padding
        mean = [sum(keys[b, i, j].item() for i in range(n)) / n for j in range(8)]
        for t in range(3):
            assert context[b, t].tolist() == pytest.approx(mean, abs=1e-12)
    other_context, other_weights = attention(10 * torch.randn_like(query), keys, valid)  # the query is not read
    torch.testing.assert_close(other_weights, weights)
    torch.testing.assert_close(other_context, context)


# ---------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("scorer", SAME_SIZE)
def test_dot_with_different_sizes_fails_at_construction(scorer):
    with pytest.raises(ConfigError) as err:
        build_attention(scorer, query_dim=128, key_dim=256)
    message = str(err.value)
    assert "d_q=128" in message and "d_k=256" in message and "general" in message


@pytest.mark.parametrize("scorer", SCORER_NAMES)
def test_heads_that_do_not_divide_the_key_size_fail_at_construction(scorer):
    with pytest.raises(ConfigError) as err:
        build_attention(scorer, 12, 12, heads=5)
    assert "heads=5" in str(err.value) and "d_k=12" in str(err.value) and "Fix:" in str(err.value)


def test_additive_attn_dim_must_split_across_heads():
    with pytest.raises(ConfigError, match="attn_dim=6"):
        build_attention("additive", 8, 8, attn_dim=6, heads=4)


def test_unknown_scorer_lists_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        build_attention("dott", 8, 8)
    assert "dott" in str(err.value) and all(name in err.value.fix for name in SCORERS)
    assert "plugins=" in str(err.value)


@pytest.mark.parametrize("scorer", SCORER_NAMES)
def test_an_option_the_scorer_does_not_take_names_its_key(scorer):
    with pytest.raises(ConfigError) as err:
        build_attention(scorer, 8, 8, window=3)
    assert "scorer.window" in str(err.value) and f"scorer={scorer}" in str(err.value)


@pytest.mark.parametrize(
    "tensor,query_shape,keys_shape,mask_shape,needed",
    [
        ("query", (2, 7), (2, 5, 8), (2, 5), "(B=2, d_q=8)"),
        ("query", (3, 8), (2, 5, 8), (2, 5), "(B=2, d_q=8)"),
        ("keys", (2, 8), (2, 5, 6), (2, 5), "(B, T_enc, d_k=8)"),
        ("keys", (2, 8), (5, 8), (2, 5), "(B, T_enc, d_k=8)"),
        ("valid_mask", (2, 8), (2, 5, 8), (2, 4), "(B=2, T_enc=5)"),
        ("valid_mask", (2, 8), (2, 5, 8), (5, 2), "(B=2, T_enc=5)"),
    ],
)
def test_wrong_shapes_raise_a_shape_error_naming_the_tensor(tensor, query_shape, keys_shape, mask_shape, needed):
    attention = build_attention("general", 8, 8)
    with pytest.raises(ShapeError) as err:
        attention(torch.randn(query_shape), torch.randn(keys_shape), torch.ones(mask_shape, dtype=torch.bool))
    assert err.value.tensor == tensor
    assert str(tuple(err.value.shape)) in str(err.value)
    assert needed in str(err.value) and "Fix:" in str(err.value)


def test_a_float_mask_is_rejected_rather_than_misread():
    attention = build_attention("dot", 4, 4)
    with pytest.raises(ShapeError, match="bool"):
        attention(torch.randn(2, 4), torch.randn(2, 3, 4), torch.ones(2, 3))


# ---------------------------------------------------------------------------------- fast paths
def test_fast_tanh_is_tanh_with_tanhs_gradient():
    from attnseq.kernels.activations import fast_tanh

    x = torch.linspace(-12, 12, 100_001).requires_grad_()
    y = fast_tanh(x)
    torch.testing.assert_close(y, torch.tanh(x), atol=3e-7, rtol=0)
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, 1 - torch.tanh(x.detach()) ** 2, atol=1e-6, rtol=0)
    x64 = x.detach().double()
    torch.testing.assert_close(fast_tanh(x64), torch.tanh(x64), atol=0, rtol=0)  # float64: torch.tanh itself


@pytest.mark.parametrize("scorer", SCORER_NAMES)
@pytest.mark.parametrize("heads", [1, 2])
def test_score_is_project_query_then_score_projected(scorer, heads):
    """The parts a fused decoder calls one by one compose to ``score``."""
    attention = build_attention(scorer, 8, 8, heads=heads).double()
    query, keys, _ = make_inputs(2, 3, 5, 8, seed=7)
    projected_keys = attention.project_keys(keys)
    weight = attention.query_weight()
    mapped = query if weight is None else query @ weight.T  # (B, T_dec, ·)
    parts = attention.score_projected(attention.split_query(mapped), projected_keys)
    torch.testing.assert_close(parts, attention.score(query, projected_keys))
    assert parts.shape == (2, heads, 3, 5)


def additive_formula(query, keys, v):
    """vᵀ tanh(q_t + K_i) per head, written out: ``(B, H, T_dec, T_enc)``."""
    return (torch.tanh(query.unsqueeze(3) + keys.unsqueeze(2)) * v[None, :, None, None, :]).sum(-1)


@pytest.mark.parametrize("chunk_bytes", [None, 1, 3000])  # default: one chunk; 1: one step per chunk; 3000: uneven
@pytest.mark.parametrize("heads", [1, 2])
def test_all_steps_additive_scores_equal_the_formula_values_and_gradients(monkeypatch, chunk_bytes, heads):
    from attnseq.kernels import additive_scores, buffers

    if chunk_bytes is not None:
        monkeypatch.setattr(buffers, "BLOCK_BYTES", chunk_bytes)
    gen = torch.Generator().manual_seed(heads)
    query = torch.randn(6, heads, 13, 16, generator=gen).requires_grad_()
    keys = torch.randn(6, heads, 17, 16, generator=gen).requires_grad_()
    v = torch.randn(heads, 16, generator=gen).requires_grad_()
    upstream = torch.randn(6, heads, 13, 17, generator=gen)
    got = additive_scores.additive_scores(query, keys, v)
    expected = additive_formula(query.double(), keys.double(), v.double())
    torch.testing.assert_close(got, expected.float(), atol=2e-5, rtol=1e-5)
    got_grads = torch.autograd.grad(got, [query, keys, v], upstream)
    expected_grads = torch.autograd.grad(expected, [query, keys, v], upstream.double())
    for name, g_got, g_expected in zip(["query", "keys", "v"], got_grads, expected_grads, strict=True):
        torch.testing.assert_close(g_got, g_expected.float(), atol=1e-4, rtol=1e-5, msg=name)


@pytest.mark.parametrize("chunk_bytes", [1, 10**9])
def test_all_steps_additive_scores_gradcheck_in_float64(monkeypatch, chunk_bytes):
    from attnseq.kernels import additive_scores, buffers

    monkeypatch.setattr(buffers, "BLOCK_BYTES", chunk_bytes)
    gen = torch.Generator().manual_seed(0)
    args = [
        torch.randn(2, 2, 3, 4, dtype=torch.float64, generator=gen).requires_grad_(),  # query
        torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=gen).requires_grad_(),  # keys
        torch.randn(2, 4, dtype=torch.float64, generator=gen).requires_grad_(),  # v
    ]
    assert torch.autograd.gradcheck(additive_scores.AdditiveScores.apply, args)


@pytest.mark.parametrize("scorer", ["additive", "concat"])
@pytest.mark.parametrize("heads", [1, 2])
def test_all_steps_additive_scores_equal_score_projected(scorer, heads):
    """The kernel computes what the scorer's own ``score_projected`` computes (float64)."""
    from attnseq.kernels.additive_scores import additive_scores

    attention = build_attention(scorer, 8, 12, heads=heads).double()
    query, keys, _ = make_inputs(3, 4, 6, 8, seed=5)
    keys = torch.randn(3, 6, 12, dtype=torch.float64)
    projected_query = attention.project_query(query)
    projected_keys = attention.project_keys(keys)
    v = attention.v_a.view(heads, -1)
    torch.testing.assert_close(
        additive_scores(projected_query, projected_keys, v), attention.score_projected(projected_query, projected_keys)
    )
