"""scorer=multihead against ``torch.nn.MultiheadAttention`` with copied weights: outputs, weights
averaged and per head, padding masks, one step and all steps, gradients; and what the decoders and
the counterfactual check get from it."""

from __future__ import annotations

import pytest
import torch
from benchmark_scripts import imported
from torch import nn

from attnseq.attention import MultiheadAttention, build_attention, lengths_to_valid_mask
from attnseq.errors import ConfigError
from attnseq.faithfulness.counterfactual import CounterfactualAttention
from attnseq.kernels import FastPaths
from attnseq.model import ModelConfig, build_seq2seq, greedy_decode


def inputs(batch: int, t_dec: int, t_enc: int, d_q: int, d_k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, t_dec, d_q, generator=gen, dtype=torch.float64)
    keys = torch.randn(batch, t_enc, d_k, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, t_enc + 1, (batch,), generator=gen)
    lengths[0] = t_enc
    return query, keys, lengths_to_valid_mask(lengths, t_enc)


def copied_from(reference: nn.MultiheadAttention, heads: int) -> MultiheadAttention:
    """Our scorer with the same weights as ``reference`` (query, key and model sizes all equal: torch
    packs W_Q, W_K, W_V into ``in_proj_weight``). Torch's key bias has no counterpart: it is left random."""
    d = reference.embed_dim
    ours = build_attention("multihead", d, d, heads=heads).double()
    w, b = reference.in_proj_weight, reference.in_proj_bias
    with torch.no_grad():
        ours.W_Q.weight.copy_(w[:d])
        ours.W_Q.bias.copy_(b[:d])
        ours.W_K.weight.copy_(w[d : 2 * d])
        ours.W_V.weight.copy_(w[2 * d :])
        ours.W_V.bias.copy_(b[2 * d :])
        ours.W_O.weight.copy_(reference.out_proj.weight)
        ours.W_O.bias.copy_(reference.out_proj.bias)
    return ours


def torch_reference(d: int, heads: int, seed: int) -> nn.MultiheadAttention:
    torch.manual_seed(seed)
    reference = nn.MultiheadAttention(d, heads, batch_first=True).double()
    with torch.no_grad():  # torch starts its biases at zero; random ones show that each is copied right
        reference.in_proj_bias.normal_()
        reference.out_proj.bias.normal_()
    return reference


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_equals_torch_multihead_attention_values_weights_and_masks(heads):
    d = 8
    reference = torch_reference(d, heads, seed=heads)
    ours = copied_from(reference, heads)
    query, keys, valid = inputs(3, 4, 6, d, d, seed=heads)
    assert not valid.all()  # some rows are padded

    context, weights = ours(query, keys, valid)  # all steps at once
    expected, per_head = reference(query, keys, keys, key_padding_mask=~valid, average_attn_weights=False)
    _, averaged = reference(query, keys, keys, key_padding_mask=~valid)
    torch.testing.assert_close(context, expected)
    torch.testing.assert_close(weights, per_head)  # (B, H, T_dec, T_enc)
    torch.testing.assert_close(weights.mean(1), averaged)  # (B, T_dec, T_enc)

    for t in range(query.shape[1]):  # one decoder step at a time: (B, d_q) → (B, d_k), (B, H, T_enc)
        step_context, step_weights = ours(query[:, t], keys, valid, projected_keys=ours.project_keys(keys))
        expected_step, per_head_step = reference(
            query[:, t : t + 1], keys, keys, key_padding_mask=~valid, average_attn_weights=False
        )
        torch.testing.assert_close(step_context, expected_step[:, 0])
        torch.testing.assert_close(step_weights, per_head_step[:, :, 0])


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_gradients_equal_torch_multihead_attentions_and_its_key_bias_gets_none(heads):
    d = 8
    reference = torch_reference(d, heads, seed=10 + heads)
    ours = copied_from(reference, heads)
    query, keys, valid = inputs(2, 3, 5, d, d, seed=heads)
    gen = torch.Generator().manual_seed(0)
    out_weights = torch.randn(2, 3, d, generator=gen, dtype=torch.float64)
    weight_weights = torch.randn(2, heads, 3, 5, generator=gen, dtype=torch.float64)

    def gradients(module, call):
        q, k = query.clone().requires_grad_(), keys.clone().requires_grad_()
        context, weights = call(module, q, k)
        ((context * out_weights).sum() + (weights * weight_weights).sum()).backward()
        return q.grad, k.grad

    ours_grads = gradients(ours, lambda m, q, k: m(q, k, valid))
    torch_grads = gradients(
        reference,
        lambda m, q, k: m(q, k, k, key_padding_mask=~valid, average_attn_weights=False),
    )
    torch.testing.assert_close(ours_grads, torch_grads)
    w, b = reference.in_proj_weight.grad, reference.in_proj_bias.grad
    torch.testing.assert_close(ours.W_Q.weight.grad, w[:d])
    torch.testing.assert_close(ours.W_Q.bias.grad, b[:d])
    torch.testing.assert_close(ours.W_K.weight.grad, w[d : 2 * d])
    torch.testing.assert_close(ours.W_V.weight.grad, w[2 * d :])
    torch.testing.assert_close(ours.W_V.bias.grad, b[2 * d :])
    torch.testing.assert_close(ours.W_O.weight.grad, reference.out_proj.weight.grad)
    torch.testing.assert_close(ours.W_O.bias.grad, reference.out_proj.bias.grad)
    torch.testing.assert_close(b[d : 2 * d], torch.zeros(d, dtype=torch.float64))  # the key bias: no effect


@pytest.mark.parametrize("heads", [1, 2])
def test_other_query_key_and_model_sizes_equal_torch_between_two_fixed_maps(heads):
    """``nn.MultiheadAttention`` takes queries and returns outputs ``embed_dim`` wide (keys and values
    may differ: kdim, vdim). Our query (d_q) and context (d_k) sizes are reached through two fixed
    random maps, A (d_m, d_q) on the query before torch's layer and P (d_k, d_m) on its output, which
    our W_Q = W_Q^torch A and W_O = P W_O^torch, b_O = P b_O^torch absorb: ours(s, K) = P · torch(A s, K, K)."""
    d_q, d_k, d_m = 6, 10, 4
    torch.manual_seed(heads)
    reference = nn.MultiheadAttention(d_m, heads, batch_first=True, kdim=d_k, vdim=d_k).double()
    with torch.no_grad():
        reference.in_proj_bias.normal_()
        reference.out_proj.bias.normal_()
    A = torch.randn(d_m, d_q, dtype=torch.float64)
    P = torch.randn(d_k, d_m, dtype=torch.float64)
    ours = build_attention("multihead", d_q, d_k, heads=heads, model_dim=d_m).double()
    assert (ours.W_Q.weight.shape, ours.W_K.weight.shape, ours.W_O.weight.shape) == ((d_m, d_q), (d_m, d_k), (d_k, d_m))
    b = reference.in_proj_bias
    with torch.no_grad():
        ours.W_Q.weight.copy_(reference.q_proj_weight @ A)
        ours.W_Q.bias.copy_(b[:d_m])
        ours.W_K.weight.copy_(reference.k_proj_weight)
        ours.W_V.weight.copy_(reference.v_proj_weight)
        ours.W_V.bias.copy_(b[2 * d_m :])
        ours.W_O.weight.copy_(P @ reference.out_proj.weight)
        ours.W_O.bias.copy_(P @ reference.out_proj.bias)
    query, keys, valid = inputs(3, 4, 5, d_q, d_k, seed=7)

    context, weights = ours(query, keys, valid)
    expected, per_head = reference(query @ A.T, keys, keys, key_padding_mask=~valid, average_attn_weights=False)
    torch.testing.assert_close(context, expected @ P.T)  # (B, T_dec, d_k)
    torch.testing.assert_close(weights, per_head)
    step_context, step_weights = ours(query[:, 2], keys, valid)
    torch.testing.assert_close(step_context, (expected @ P.T)[:, 2])
    torch.testing.assert_close(step_weights, per_head[:, :, 2])


def test_keys_and_values_are_projected_once_per_batch_not_per_step():
    torch.manual_seed(0)
    config = ModelConfig(11, 13, embedding_dim=8, hidden_size=12, scorer="multihead", heads=2, decoder="bahdanau")
    src = torch.tensor([[5, 6, 7, 8], [4, 9, 0, 0]])
    lengths = torch.tensor([4, 2])
    tgt_in = torch.tensor([[1, 5, 6], [1, 7, 8]])
    # the fused Bahdanau loop also takes the values through W_ic once (``values_through``); stepping does not
    for fast_paths, values in ((FastPaths(), 2), (FastPaths(fused_decoder=False), 1)):
        model = build_seq2seq(config, fast_paths).double().train()
        assert model.decoder.takes_fast_path() == fast_paths.fused_decoder
        calls = {"W_K": 0, "W_V": 0, "W_Q": 0}

        def count(name: str, calls: dict[str, int] = calls):
            return lambda *_: calls.__setitem__(name, calls[name] + 1)

        for name in calls:
            getattr(model.attention, name).register_forward_hook(count(name))
        model(src, lengths, tgt_in)
        assert calls == {"W_K": 1, "W_V": values, "W_Q": 0}  # W_Q is applied through query_weight(), per step
        model.eval()
        greedy_decode(model, src, lengths, max_length=6)
        assert calls["W_K"] == 2 and calls["W_V"] == values + 1


@pytest.mark.parametrize("decoder", ["bahdanau", "luong"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_rearranged_loops_slice_nothing_per_step(cell, decoder):
    """Teacher forcing through the rearranged loop (``fused_decoders``) under autograd: the keys the scores read
    are taken out of the projected keys and values once, and each step's state projection split once, so no
    slice's backward (a zero buffer of the whole tensor) grows with the target's length."""
    config = ModelConfig(11, 13, embedding_dim=8, hidden_size=12, cell=cell, scorer="multihead", heads=2,
                         decoder=decoder)
    torch.manual_seed(0)
    model = build_seq2seq(config).double().train()
    assert model.decoder.takes_fast_path()
    src, lengths = torch.tensor([[5, 6, 7, 8], [4, 9, 0, 0]]), torch.tensor([4, 2])
    counts = {}
    with imported("gpu_check") as gpu_check:  # its walk over a backward graph, each node once
        graph_nodes = gpu_check.graph_nodes
    for steps in (3, 8):
        logits, _ = model(src, lengths, torch.randint(3, 13, (2, steps)))
        nodes = graph_nodes(logits)
        counts[steps] = nodes.count("SliceBackward0")
        assert nodes.count("SplitWithSizesBackward0") >= steps  # the per-step split is there
    assert counts[3] == counts[8]


def test_scores_read_the_scoring_keys_alone_or_out_of_the_whole():
    attention = build_attention("multihead", 12, 8, heads=2).double()
    query, keys, _ = inputs(3, 4, 5, 12, 8, seed=2)
    projected = attention.project_keys(keys)  # (B, H, T_enc, 2·d_m/H)
    projected_query = attention.project_query(query)  # (B, H, T_dec, d_m/H)
    scoring = attention.scoring_keys(projected)
    assert scoring.shape[-1] == attention.head_dim
    torch.testing.assert_close(attention.score_projected(projected_query, scoring),
                               attention.score_projected(projected_query, projected))


def test_values_through_is_the_context_through_a_matrix():
    """What a fused Luong loop reads per step: Σ_h weights_h @ values_through(keys, M)_h = context @ Mᵀ."""
    attention = build_attention("multihead", 6, 8, heads=2, model_dim=4).double()
    with torch.no_grad():
        attention.W_O.bias.normal_()
        attention.W_V.bias.normal_()
    query, keys, valid = inputs(2, 3, 5, 6, 8, seed=3)
    context, weights = attention(query, keys, valid)
    M = torch.randn(7, 8, dtype=torch.float64)
    through = attention.values_through(keys, M)  # (B, H, T_enc, 7)
    torch.testing.assert_close((weights @ through).sum(1), context @ M.T)


def test_the_counterfactual_check_averages_multiheads_own_values():
    """Uniform weights over the real tokens: context = W_O (W_V mean(h_valid) + b_V) + b_O."""
    attention = build_attention("multihead", 8, 8, heads=2).double()
    with torch.no_grad():
        attention.W_O.bias.normal_()
        attention.W_V.bias.normal_()
    swapped = CounterfactualAttention(attention, "uniform", torch.Generator().manual_seed(0))
    query, keys, valid = inputs(3, 2, 5, 8, 8, seed=4)
    context, _ = swapped(query, keys, valid)
    for b in range(3):
        mean_key = keys[b][valid[b]].mean(0)  # (d_k,)
        expected = attention.W_O(attention.W_V(mean_key))  # (d_k,)
        torch.testing.assert_close(context[b], expected.expand(2, -1))


def test_model_dim_must_split_into_the_heads():
    with pytest.raises(ConfigError) as caught:
        build_attention("multihead", 8, 8, heads=4, model_dim=6)
    assert "scorer.model_dim=6" in str(caught.value) and "model.heads=4" in str(caught.value)
    assert "multiple of 4" in caught.value.fix
