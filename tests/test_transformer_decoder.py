"""decoder=transformer: its layer against ``nn.TransformerDecoderLayer(norm_first=True)``, the whole
model against ``nn.Transformer``, with copied weights (values and gradients, padding on both sides);
key/value-cache decoding against recomputing the whole prefix (greedy, beam and the n best); its config checks;
and, through the real CLI, training with encoder=transformer and encoder=gru into MLflow with its
heatmaps, then evaluate.py decoding both runs (beam with α, the n best) and their MLflow models
decoding as the model library does (greedy, beam with α, the n best)."""

from __future__ import annotations

import copy
import csv

import mlflow
import pandas as pd
import pytest
import torch
from cli_helpers import (
    EVALUATE_PY,
    TRANSLATE_PY,
    all_runs,
    artifact_paths,
    explain,
    outputs_under,
    run_cli,
    tiny,
    tracking_uri,
)
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient
from model_checks import (
    assert_same_outputs_and_gradients,
    forward_and_gradients,
    hand_self_attention,
    outputs_and_gradients,
    padded_batch,
)
from serving_checks import assert_n_best_as_the_library, expected_outputs
from torch import nn

from attnseq.attention import SCORERS, MultiheadAttention, lengths_to_valid_mask
from attnseq.config import validate_translate
from attnseq.errors import ConfigError
from attnseq.evaluation.translate import translate
from attnseq.faithfulness.counterfactual import CounterfactualAttention, counterfactual_decoder
from attnseq.metrics.alignment import DIAGNOSTICS
from attnseq.model import ModelConfig, beam_search, beam_search_n_best, build_seq2seq, decoder_inputs, greedy_decode
from attnseq.model.state import DecoderState, Memory
from attnseq.model.transformer_decoder import TransformerDecoder, TransformerDecoderLayer
from attnseq.tracking import paths, tags
from attnseq.tracking.logged_model import logging_scope
from attnseq.tracking.plots import attention_heatmap, self_attention_heatmaps

V_SRC, V_TGT = 11, 13


def make_model(encoder="transformer", layers=2, heads=2, shown_layer=None, scorer="multihead", seed=0, **extra):
    torch.manual_seed(seed)
    encoder_options = {"layers": 2, "heads": 3, "ff_dim": 16} if encoder == "transformer" else {}
    config = ModelConfig(
        V_SRC, V_TGT, embedding_dim=8, hidden_size=12, scorer=scorer, heads=heads, decoder="transformer",
        decoder_options={"layers": layers, "heads": 3, "ff_dim": 20, "shown_layer": shown_layer},
        encoder="transformer" if encoder == "transformer" else "rnn", encoder_options=encoder_options,
        cell="lstm" if encoder == "lstm" else "gru", bidirectional=encoder == "bigru", **extra,
    )
    return build_seq2seq(config).double()


def randomise(module: nn.Module) -> None:
    """Every parameter away from its default (zero biases, unit norms), so that every copy shows."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.5)


def copy_attention(theirs: nn.MultiheadAttention, ours: MultiheadAttention) -> None:
    d = ours.W_Q.weight.shape[0]
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.W_Q.weight, ours.W_K.weight, ours.W_V.weight]))
        key_bias = torch.randn(d).double()  # torch's key bias: no effect
        theirs.in_proj_bias.copy_(torch.cat([ours.W_Q.bias, key_bias, ours.W_V.bias]))
        theirs.out_proj.weight.copy_(ours.W_O.weight)
        theirs.out_proj.bias.copy_(ours.W_O.bias)


def copy_decoder_layer(theirs: nn.TransformerDecoderLayer, ours: TransformerDecoderLayer) -> None:
    copy_attention(theirs.self_attn, ours.self_attention)
    copy_attention(theirs.multihead_attn, ours.cross_attention)
    with torch.no_grad():
        for their, mine in [(theirs.norm1, ours.self_attention_norm), (theirs.norm2, ours.cross_attention_norm),
                            (theirs.norm3, ours.feed_forward_norm), (theirs.linear1, ours.feed_forward[0]),
                            (theirs.linear2, ours.feed_forward[3])]:
            their.weight.copy_(mine.weight)
            their.bias.copy_(mine.bias)


def causal_mask(steps: int) -> torch.Tensor:
    """torch's convention: True where a query may NOT look (a key after it)."""
    return torch.ones(steps, steps, dtype=torch.bool).triu(1)


def real_positions_loss(outputs: torch.Tensor, tgt_valid: torch.Tensor) -> torch.Tensor:
    """A loss with a gradient of its own for every output value at a real target position."""
    weights = torch.linspace(-1, 1, outputs.shape[-1], dtype=outputs.dtype)
    return ((outputs.sin() * weights).sum(-1) * tgt_valid).sum()


# ---------------------------------------------------------------------- one layer, the stack, the model
@pytest.mark.parametrize("heads", [1, 3])
def test_the_layer_equals_torchs_pre_norm_transformer_decoder_layer(heads):
    """Values and gradients at the real target positions, the source padded (garbage in the padded
    keys) and the targets padded (torch masks them as keys; causally, no real position sees them)."""
    d, ff = 12, 20
    torch.manual_seed(heads)
    ours = TransformerDecoderLayer(d, heads, ff, dropout=0.0, cross_attention=MultiheadAttention(d, d, heads)).double()
    randomise(ours)
    reference = nn.TransformerDecoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True).double()
    copy_decoder_layer(reference, ours)
    src_valid = lengths_to_valid_mask(torch.tensor([5, 2, 4]), 5)  # (B, T_enc)
    tgt_valid = lengths_to_valid_mask(torch.tensor([4, 3, 1]), 4)  # (B, T_dec)
    keys = torch.randn(3, 5, d, dtype=torch.float64, requires_grad=True)
    states = torch.randn(3, 4, d, dtype=torch.float64, requires_grad=True)

    memory = Memory(keys, src_valid, None)
    mine, weights, _, self_weights = ours(states, None, memory, ours.cross_attention.project_keys(keys), start=0)
    theirs = reference(states, keys, tgt_mask=causal_mask(4), tgt_key_padding_mask=~tgt_valid,
                       memory_key_padding_mask=~src_valid)
    torch.testing.assert_close(mine[tgt_valid], theirs[tgt_valid])
    normed = reference.norm1(states)  # the masked self-attention's weights, per head, as torch's own
    _, their_self = reference.self_attn(normed, normed, normed, attn_mask=causal_mask(4), need_weights=True,
                                        average_attn_weights=False)  # (B, H, T_dec, T_dec)
    torch.testing.assert_close(self_weights, their_self)
    assert weights.shape == (3, heads, 4, 5)
    assert torch.all(weights[~src_valid[:, None, None, :].expand_as(weights)] == 0)

    my_grads = torch.autograd.grad(real_positions_loss(mine, tgt_valid), [states, keys, *ours.parameters()])
    their_grads = torch.autograd.grad(real_positions_loss(theirs, tgt_valid), [states, keys, *reference.parameters()])
    torch.testing.assert_close(my_grads[0], their_grads[0])
    torch.testing.assert_close(my_grads[1], their_grads[1])
    mine_named = dict(zip([n for n, _ in ours.named_parameters()], my_grads[2:]))
    theirs_named = dict(zip([n for n, _ in reference.named_parameters()], their_grads[2:]))
    for attention, their_name in (("self_attention", "self_attn"), ("cross_attention", "multihead_attn")):
        in_proj = theirs_named[f"{their_name}.in_proj_weight"].chunk(3)
        for part, grad in zip("QKV", in_proj):
            torch.testing.assert_close(mine_named[f"{attention}.W_{part}.weight"], grad)
        bias = theirs_named[f"{their_name}.in_proj_bias"].chunk(3)
        torch.testing.assert_close(mine_named[f"{attention}.W_Q.bias"], bias[0])
        torch.testing.assert_close(bias[1], torch.zeros_like(bias[1]))  # torch's key bias never learns
        torch.testing.assert_close(mine_named[f"{attention}.W_V.bias"], bias[2])
        torch.testing.assert_close(mine_named[f"{attention}.W_O.weight"], theirs_named[f"{their_name}.out_proj.weight"])
        torch.testing.assert_close(mine_named[f"{attention}.W_O.bias"], theirs_named[f"{their_name}.out_proj.bias"])
    for their, mine_name in [("norm1", "self_attention_norm"), ("norm2", "cross_attention_norm"),
                             ("norm3", "feed_forward_norm"), ("linear1", "feed_forward.0"),
                             ("linear2", "feed_forward.3")]:
        for kind in ("weight", "bias"):
            torch.testing.assert_close(mine_named[f"{mine_name}.{kind}"], theirs_named[f"{their}.{kind}"])


def test_the_whole_model_equals_nn_transformer():
    """encoder=transformer + decoder=transformer with scorer=multihead is ``nn.Transformer(norm_first=True)``
    between the embeddings (√E-scaled plus sinusoidal positions, computed by our model) and the output
    layer: logits and every gradient, the source and the targets padded."""
    d, heads, ff, n = 12, 3, 16, 2
    torch.manual_seed(0)
    config = ModelConfig(V_SRC, V_TGT, embedding_dim=d, hidden_size=d, scorer="multihead", heads=heads,
                         decoder="transformer", decoder_options={"layers": n, "heads": heads, "ff_dim": ff},
                         encoder="transformer", encoder_options={"layers": n, "heads": heads, "ff_dim": ff})
    model = build_seq2seq(config).double()
    randomise(model)
    reference = nn.Transformer(d, heads, n, n, ff, dropout=0.0, batch_first=True, norm_first=True).double()
    encoder, decoder = model.encoder, model.decoder
    with torch.no_grad():
        for theirs, mine in zip(reference.encoder.layers, encoder.layers):
            copy_attention(theirs.self_attn, mine.self_attention)
            for their, my in [(theirs.norm1, mine.attention_norm), (theirs.norm2, mine.feed_forward_norm),
                              (theirs.linear1, mine.feed_forward[0]), (theirs.linear2, mine.feed_forward[3])]:
                their.weight.copy_(my.weight)
                their.bias.copy_(my.bias)
        for theirs, mine in zip(reference.decoder.layers, decoder.layers):
            copy_decoder_layer(theirs, mine)
        for their, my in [(reference.encoder.norm, encoder.final_norm), (reference.decoder.norm, decoder.final_norm)]:
            their.weight.copy_(my.weight)
            their.bias.copy_(my.bias)
    src, lengths, tgt_in = padded_batch(V_SRC, V_TGT)
    tgt_lengths = torch.tensor([5, 2, 4, 1])
    tgt_in = tgt_in.masked_fill(~lengths_to_valid_mask(tgt_lengths, 5), 0)
    src_valid, tgt_valid = lengths_to_valid_mask(lengths), lengths_to_valid_mask(tgt_lengths, 5)

    def ours():
        logits, _ = model(src, lengths, tgt_in)  # (B, T_dec, V)
        return logits

    def theirs():
        src_in = encoder.input_map(encoder.embedding(src) * encoder.embedding_scale + decoder_positions(src, encoder))
        states = reference(src_in, decoder.embed(tgt_in, 0), tgt_mask=causal_mask(5),
                           src_key_padding_mask=~src_valid, tgt_key_padding_mask=~tgt_valid,
                           memory_key_padding_mask=~src_valid)  # (B, T_dec, d)
        return decoder.output(states)  # (B, T_dec, V)

    results = []
    for forward in (ours, theirs):
        model.zero_grad()
        reference.zero_grad()
        logits = forward()
        real_positions_loss(logits, tgt_valid).backward()
        results.append((logits, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}))
    (my_logits, my_grads), (their_logits, their_grads) = results
    torch.testing.assert_close(my_logits[tgt_valid], their_logits[tgt_valid])
    outside = ("encoder.embedding", "decoder.embedding", "decoder.output")
    shared = {name for name in my_grads if name.startswith(outside)}
    assert shared and shared <= their_grads.keys()
    for name in shared:  # the parts both paths run through ours
        torch.testing.assert_close(my_grads[name], their_grads[name], msg=name)
    theirs_by_part = dict(reference.named_parameters())
    for i, ref_layer in enumerate(reference.decoder.layers):  # and the decoder's weights, against torch's copies
        assert ref_layer.linear1.weight.grad is not None
        torch.testing.assert_close(my_grads[f"decoder.layers.{i}.feed_forward.0.weight"], ref_layer.linear1.weight.grad)
        torch.testing.assert_close(my_grads[f"decoder.layers.{i}.cross_attention.W_O.weight"],
                                   ref_layer.multihead_attn.out_proj.weight.grad)
        q, k, _ = ref_layer.self_attn.in_proj_weight.grad.chunk(3)
        torch.testing.assert_close(my_grads[f"decoder.layers.{i}.self_attention.W_Q.weight"], q)
        torch.testing.assert_close(my_grads[f"decoder.layers.{i}.self_attention.W_K.weight"], k)
    torch.testing.assert_close(my_grads["encoder.layers.0.feed_forward.0.weight"],
                               theirs_by_part["encoder.layers.0.linear1.weight"].grad)
    torch.testing.assert_close(my_grads["decoder.final_norm.weight"], reference.decoder.norm.weight.grad)


def decoder_positions(tokens: torch.Tensor, encoder: nn.Module) -> torch.Tensor:
    from attnseq.model.transformer_encoder import sinusoidal_positions

    return sinusoidal_positions(tokens.shape[1], encoder.embedding.embedding_dim, torch.float64, tokens.device)


# ---------------------------------------------------------------------- the key/value cache
@pytest.mark.parametrize("encoder", ["transformer", "gru", "bigru", "lstm"])
def test_stepping_with_the_cache_equals_the_one_pass_causal_decode(encoder):
    """Values and gradients; with a bidirectional encoder the keys are 2d wide and the context is mapped to d."""
    model = make_model(encoder, layers=3)
    assert (model.encoder.key_dim == 24) == (encoder == "bigru")
    assert_same_outputs_and_gradients(*forward_and_gradients(model, *padded_batch(V_SRC, V_TGT)))


@pytest.mark.parametrize("local", ["monotonic", "predictive"])
def test_cross_attention_within_a_local_window_steps_like_the_one_pass(local):
    """Luong's local-m reads the step index t: the one pass gives query t its own t, as stepping does."""
    model = make_model("gru", scorer="general", local=local, window=2)
    assert_same_outputs_and_gradients(*forward_and_gradients(model, *padded_batch(V_SRC, V_TGT)))


class PrefixRecomputing(TransformerDecoder):
    """The reference: no cache; every step decodes the whole prefix again (carried in ``state.cache``
    as token ids, which beam search reorders like any state) and keeps its last position."""

    def step(self, prev_tokens, state, memory):
        prefix = prev_tokens[:, None] if state.cache is None else torch.cat([state.cache, prev_tokens[:, None]], 1)
        logits, weights, _, _ = self.decode(prefix, DecoderState(state.rnn), memory)  # (B, t + 1, V)
        return logits[:, -1], weights[:, :, -1], DecoderState(state.rnn, None, state.step + 1, prefix)


@pytest.mark.parametrize("encoder", ["transformer", "bigru"])
def test_greedy_and_beam_with_the_cache_equal_recomputing_the_whole_prefix(encoder):
    model = make_model(encoder, layers=2, seed=3).eval()
    recomputing = copy.deepcopy(model)
    recomputing.decoder.__class__ = PrefixRecomputing
    src, lengths, _ = padded_batch(V_SRC, V_TGT, lengths=(6, 3, 1, 4, 5))
    for decode in (lambda m: greedy_decode(m, src, lengths, 9, check_every=1),
                   lambda m: beam_search(m, src, lengths, 4, 9),
                   lambda m: beam_search(m, src, lengths, 3, 9, length_penalty=0.6, greedy_fallback=False)):
        cached, recomputed = decode(model), decode(recomputing)
        assert torch.equal(cached.tokens, recomputed.tokens) and torch.equal(cached.lengths, recomputed.lengths)
        torch.testing.assert_close(cached.attention, recomputed.attention)
        assert cached.attention.shape[1] == 2 * 2  # layers × heads
        if hasattr(cached, "scores"):
            torch.testing.assert_close(cached.scores, recomputed.scores)


@pytest.mark.parametrize("encoder", ["transformer", "bigru"])
def test_the_n_best_with_the_cache_equal_recomputing_the_whole_prefix(encoder):
    """Beam search reorders the cache with each kept hypothesis: every one of the n best, not only the
    first, is what recomputing its prefix gives (tokens, log-probabilities, ranking and weights)."""
    model = make_model(encoder, layers=2, seed=3).eval()
    recomputing = copy.deepcopy(model)
    recomputing.decoder.__class__ = PrefixRecomputing
    src, lengths, _ = padded_batch(V_SRC, V_TGT, lengths=(6, 3, 1, 4, 5))
    for length_penalty, greedy_fallback in ((0.0, True), (0.6, False)):
        cached, recomputed = (beam_search_n_best(m, src, lengths, 5, 4, 9, length_penalty=length_penalty,
                                                 greedy_fallback=greedy_fallback) for m in (model, recomputing))
        assert cached.tokens.shape[:2] == (5, 4) and cached.count() == [4] * 5
        assert torch.equal(cached.tokens, recomputed.tokens) and torch.equal(cached.lengths, recomputed.lengths)
        torch.testing.assert_close(cached.scores, recomputed.scores)
        torch.testing.assert_close(cached.rank_scores, recomputed.rank_scores)
        torch.testing.assert_close(cached.attention, recomputed.attention)  # (B, N, layers × heads, T_out, T_enc)
        assert cached.attention.shape[2] == 2 * 2


# ---------------------------------------------------------------------- what the weights are
def test_the_weights_are_every_layers_heads_or_the_shown_layers():
    src, lengths, tgt_in = padded_batch(V_SRC, V_TGT)
    every = make_model(layers=3, heads=2).eval()
    shown = make_model(layers=3, heads=2, shown_layer=2).eval()
    shown.load_state_dict(every.state_dict())
    _, all_weights = every(src, lengths, tgt_in)  # (B, N·H, T_dec, T_enc)
    _, layer_two = shown(src, lengths, tgt_in)  # (B, H, T_dec, T_enc)
    assert all_weights.shape == (4, 6, 5, 6) and layer_two.shape == (4, 2, 5, 6)
    torch.testing.assert_close(all_weights[:, 2:4], layer_two)
    torch.testing.assert_close(all_weights.sum(-1), torch.ones(4, 6, 5, dtype=torch.float64))
    labels = every.decoder.head_labels(all_weights.shape[1])
    assert labels == [f"layer {layer} head {h}" for layer in (1, 2, 3) for h in (0, 1)]  # layer-major, as the rows
    assert shown.decoder.head_labels(layer_two.shape[1]) == ["layer 2 head 0", "layer 2 head 1"]
    figure = attention_heatmap(all_weights[0].detach().numpy(), list("abcdef"), list("vwxyz"), "t",
                               head_labels=labels)
    panels = [axis.get_title() for axis in figure.axes if axis.images]
    assert len(panels) == 1 + 6 and panels[1:] == labels  # the mean, then each layer's heads by name


@pytest.mark.parametrize("encoder", ["transformer", "gru"])
def test_the_decoders_self_attention_maps_are_causal_and_each_layers_softmax_by_hand(encoder):
    """``Seq2Seq.self_attention``: per decoder layer ``(B, H, T_dec, T_dec)``, softmax(Q Kᵀ / √d_h) from the
    layer's own weights under the causal mask, exactly 0 above the diagonal, rows summing to 1; the
    encoder's too for encoder=transformer (none for a GRU's); a decoded target's maps equal stepping's."""
    src, lengths, tgt_in = padded_batch(V_SRC, V_TGT)
    model = make_model(encoder=encoder, layers=2).eval()
    with torch.no_grad():
        maps = model.self_attention(src, lengths, tgt_in)
        assert model.config.self_attending == (encoder == "transformer", True)
        assert len(maps.encoder) == (2 if encoder == "transformer" else 0) and len(maps.decoder) == 2
        memory, state = model.encode(src, lengths)
        decoder = model.decoder
        steps = tgt_in.shape[1]
        causal = torch.ones(steps, steps, dtype=torch.bool).tril()[None]  # (1, T, T): keys at or before the query
        states = decoder.embed(tgt_in)  # (B, T, d)
        per_layer = memory.projected_keys.chunk(2, dim=1)
        for index, (layer, weights) in enumerate(zip(decoder.layers, maps.decoder)):
            assert weights.shape == (4, 3, steps, steps)
            torch.testing.assert_close(weights, hand_self_attention(layer.self_attention, layer.self_attention_norm,
                                                                    states, causal))
            assert torch.all(weights.triu(1) == 0)
            torch.testing.assert_close(weights.sum(-1), torch.ones(4, 3, steps, dtype=torch.float64))
            states = layer(states, None, memory, per_layer[index], 0)[0]  # (B, T, d): the next layer's input

        decoded = greedy_decode(model, src, lengths, max_length=6)
        decoded_maps = model.self_attention(src, lengths, decoder_inputs(decoded.tokens))
        memory, state = model.encode(src, lengths)
        inputs = decoder_inputs(decoded.tokens)
        for t in range(inputs.shape[1]):  # step by step with the cache: row t of each layer's map
            _, _, cache, stepped = decoder.decode(inputs[:, t : t + 1], state, memory)
            state = DecoderState(state.rnn, None, state.step + 1, cache)
            for layer_map, step_weights in zip(decoded_maps.decoder, stepped):
                torch.testing.assert_close(layer_map[:, :, t, : t + 1], step_weights[:, :, 0])
    n_out = int(decoded.lengths[0])
    row = decoded_maps.of_row(0, int(lengths[0]), n_out)
    assert [m.shape for m in row["decoder"]] == [(3, n_out, n_out)] * 2
    out_tokens = [f"o{t}" for t in range(n_out)]
    figures = self_attention_heatmaps(row, [f"s{i}" for i in range(int(lengths[0]))], out_tokens, "t", "<s>")
    assert set(figures) == ({"encoder", "decoder"} if encoder == "transformer" else {"decoder"})
    panels = [ax for ax in figures["decoder"].axes if ax.images]  # a row per layer: the mean, each head
    assert [ax.get_title() for ax in panels][:4] == ["layer 1, mean over heads", "layer 1 head 0", "layer 1 head 1",
                                                      "layer 1 head 2"]
    assert len(panels) == 2 * 4 and panels[4].get_title() == "layer 2, mean over heads"
    torch.testing.assert_close(torch.tensor(panels[5].images[0].get_array()), torch.tensor(row["decoder"][1][0]))
    assert [t.get_text() for t in panels[0].get_xticklabels()] == ["<s>", *out_tokens[:-1]]
    assert [t.get_text() for t in panels[0].get_yticklabels()] == out_tokens


def test_any_scorer_can_be_the_cross_attention_and_the_counterfactual_swaps_every_layer():
    src, lengths, tgt_in = padded_batch(V_SRC, V_TGT)
    model = make_model("bigru", scorer="additive").eval()
    logits, weights = model(src, lengths, tgt_in)
    assert logits.shape == (4, 5, V_TGT) and weights.shape == (4, 4, 5, 6)
    twin = counterfactual_decoder(model.decoder, "uniform", torch.Generator().manual_seed(0))
    assert all(isinstance(layer.cross_attention, CounterfactualAttention) for layer in twin.layers)
    _, uniform = twin(tgt_in, *reversed(model.encode(src, lengths)))
    valid = lengths_to_valid_mask(lengths)[:, None, None, :].expand_as(uniform)
    torch.testing.assert_close(uniform[valid], (1.0 / lengths.double())[:, None, None, None].expand_as(uniform)[valid])


@pytest.mark.parametrize("scorer", [name for name, cls in SCORERS.items() if cls.fused_recurrence == "additive"])
@pytest.mark.parametrize("encoder", ["gru", "bigru", "transformer"])
@pytest.mark.parametrize("heads", [1, 2])
def test_an_additive_cross_attention_through_the_all_steps_kernel_equals_the_scorers_own(
    monkeypatch, scorer, encoder, heads
):
    """``FastPaths.additive_all_steps``: every layer's additive/concat cross-attention of all positions through
    ``kernels.additive_scores`` — the logits, weights and gradients of the scorer's own score under autograd;
    a hooked cross-attention (which must see every call) calls the scorer itself."""
    from attnseq.kernels import FastPaths, additive_scores

    calls = []
    original = additive_scores.AdditiveScores.apply
    monkeypatch.setattr(additive_scores.AdditiveScores, "apply", lambda *args: calls.append(1) or original(*args))
    fast = make_model(encoder, scorer=scorer, heads=heads).train()
    plain = build_seq2seq(fast.config, FastPaths(additive_all_steps=False)).double().train()
    plain.load_state_dict(fast.state_dict())
    src, lengths, tgt_in = padded_batch(V_SRC, V_TGT)
    reference = outputs_and_gradients(plain, lambda: plain(src, lengths, tgt_in))
    assert calls == []
    assert_same_outputs_and_gradients(outputs_and_gradients(fast, lambda: fast(src, lengths, tgt_in)), reference)
    assert len(calls) == len(fast.decoder.layers)
    calls.clear()
    handle = fast.decoder.layers[0].cross_attention.register_forward_hook(lambda *args: None)
    try:
        assert_same_outputs_and_gradients(outputs_and_gradients(fast, lambda: fast(src, lengths, tgt_in)), reference)
    finally:
        handle.remove()
    assert len(calls) == len(fast.decoder.layers) - 1


@pytest.mark.parametrize("change,key", [
    (dict(scorer="none"), "scorer=none"),
    (dict(decoder_options={"heads": 5}), "decoder.heads"),
    (dict(decoder_options={"layers": 2, "shown_layer": 3}), "decoder.shown_layer"),
    (dict(decoder_options={"layers": 0}), "decoder.layers"),
])
def test_a_bad_transformer_decoder_config_names_its_key(change, key):
    config = dict(embedding_dim=8, hidden_size=12, scorer="multihead", decoder="transformer") | change
    with pytest.raises(ConfigError) as raised:
        ModelConfig(V_SRC, V_TGT, **config).validate()
    assert key in str(raised.value)


def test_the_saved_config_keeps_the_decoders_settings():
    model = make_model(layers=3)
    import dataclasses

    saved = ModelConfig.from_saved(dataclasses.asdict(model.config))
    assert saved.decoder_options["layers"] == 3 and len(build_seq2seq(saved).decoder.layers) == 3


# ---------------------------------------------------------------------- through the real CLI
def assert_png(client: MlflowClient, run_id: str, artifact: str, folder) -> None:
    """The run's ``artifact`` is a PNG image of a plausible size (a heatmap panel is 3 inches or more)."""
    from PIL import Image

    local = client.download_artifacts(run_id, artifact, str(folder / run_id))
    with Image.open(local) as image:
        assert image.format == "PNG" and image.width >= 450 and image.height >= 300, (artifact, image.size)

ALIGNMENT = [d for d in DIAGNOSTICS if d != "align_precision"]
"""The alignment metrics a barely trained run logs (precision needs at least one confident link)."""

SMALL = ("decoder=transformer", "model.heads=2", "decoder.heads=2", "decoder.ff_dim=32", "decoder.layers=2")


@pytest.mark.slow
def test_train_and_evaluate_through_the_cli_with_a_transformer_and_a_gru_encoder(tmp_path):
    """Two runs (encoder=transformer, encoder=gru) into one MLflow store with their heatmaps (the mean
    and each of the 2 layers × 2 heads), alignment metrics and self-attention figures (one sample's, to
    save time), then one evaluate.py decoding both with a beam, α and the n best (its table, its
    alignment metrics; the self-attention beside its heatmaps), then each run's MLflow model: greedy,
    beam with α, the n best, as the library decodes."""
    store = outputs_under(tmp_path, seeded=True)
    # the GRU run's heatmaps and alignment metrics read its chosen layer's heads alone (decoder.shown_layer)
    for encoder in (("encoder=transformer", "encoder.heads=2", "encoder.ff_dim=32"),
                    ("encoder=gru", "decoder.shown_layer=2")):
        proc = run_cli(tmp_path, *encoder, *SMALL, *tiny(max_epochs=2), "tracking.heatmap_samples=1", *store)
        assert proc.returncode == 0, explain(proc)
    client = MlflowClient(tracking_uri(tmp_path))
    trained = {r.data.params["encoder.name"]: r for r in all_runs(client) if r.data.tags.get("attnseq.kind") == "train"}
    assert set(trained) == {"transformer", "gru"}
    for run in trained.values():
        assert run.info.status == "FINISHED"
        params = run.data.params
        assert params["decoder.convention"] == "transformer" and params["scorer.name"] == "multihead"
        assert params["decoder.layers"] == "2" and params["decoder.heads"] == "2"
        assert (params["decoder.shown_layer"] == "2") == (params["encoder.name"] == "gru")
        assert 0.0 <= run.data.metrics["val/acc"] <= 1.0
        # the alignment metrics read every layer's heads (copy has a gold alignment); precision needs a
        # confident link, which a barely trained model may not make
        assert {f"val/{d}" for d in ALIGNMENT} <= set(run.data.metrics), sorted(run.data.metrics)
        assert 0.0 <= run.data.metrics["val/align_acc"] <= run.data.metrics["val/align_acc_near"] <= 1.0
        held = artifact_paths(client, run.info.run_id)
        assert {paths.heatmap_file("short"), paths.best_heatmap_file("short")} <= held
        # the self-attention beside them: the decoder's, and a Transformer encoder's (none for a GRU)
        stacks = {"decoder", *(["encoder"] if params["encoder.name"] == "transformer" else [])}
        figures = {paths.self_attention_file(stack, "short", best) for stack in stacks for best in (False, True)}
        folder = paths.folder(paths.self_attention_file("decoder", "short"))
        assert {p for p in held if p.startswith(f"{folder}/")} == figures
        for stack in stacks:
            assert_png(client, run.info.run_id, paths.self_attention_file(stack, "short"), tmp_path)
        images = {p for p in held if "self_attention" in p and p.endswith(".png") and p not in figures}
        assert len({p for p in images if "decoder_short" in p}) >= 2, sorted(images)  # step 0, each epoch's

    proc = run_cli(tmp_path, f"run_ids=[{','.join(r.info.run_id for r in trained.values())}]", "eval.lengths=[1,8]",
                   "eval.size=40", "eval.beam_size=3", "eval.length_penalty=0.6", "eval.n_best=2",
                   f"mlflow.tracking_uri={tracking_uri(tmp_path)}", f"hydra.run.dir={tmp_path}/eval",
                   script=EVALUATE_PY)
    assert proc.returncode == 0, explain(proc)
    evaluations = [r for r in all_runs(client) if r.data.tags.get("attnseq.kind") == "eval"]
    assert len(evaluations) == 2
    for run in evaluations:
        metrics = run.data.metrics
        assert 0.0 <= metrics["eval/acc"] <= 1.0 and 0.0 <= metrics["eval/exact_match"] <= 1.0
        assert {"eval/cf_permute_flip_rate", "eval/cf_uniform_tv", "eval/attn_entropy"} <= set(metrics)
        assert {f"eval/{d}" for d in ALIGNMENT} | {f"eval/{d}_train_lengths" for d in ALIGNMENT} <= set(metrics)
        assert 0.0 <= metrics["eval/attn_mass_gold"] <= 1.0 and 0.0 <= metrics["eval/aer"] <= 1.0
        assert run.data.params["eval.length_penalty"] == "0.6" and run.data.params["eval.n_best"] == "2"
        evaluated = next(r for r in trained.values() if r.info.run_id == run.data.tags[tags.EVALUATED_RUN])
        stacks = {"decoder", *(["encoder"] if evaluated.data.params["encoder.name"] == "transformer" else [])}
        held = artifact_paths(client, run.info.run_id)
        long = sorted(p for p in held if p.startswith(paths.long_heatmap(0, 1).split("_")[0]))  # heatmaps/long_
        own = paths.folder(paths.self_attention_beside("decoder", long[0]))
        assert {p for p in held if p.startswith(f"{own}/")} == {
            paths.self_attention_beside(stack, heatmap) for stack in stacks for heatmap in long}
        for stack in stacks:
            assert_png(client, run.info.run_id, paths.self_attention_beside(stack, long[-1]), tmp_path)
        table = client.download_artifacts(run.info.run_id, f"{paths.EVAL_TABLES}/{paths.N_BEST_TABLE}",
                                          str(tmp_path / run.info.run_id))
        with open(table, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        assert [(row["example"], row["rank"]) for row in rows] == [(str(i), str(k)) for i in range(40) for k in (1, 2)]
        assert all(float(a["score"]) >= float(b["score"]) for a, b in zip(rows[::2], rows[1::2]))

    # the comparison: the longest shared sample's self-attention beside its cross-attention, a column per run
    # that has the stack's self-attention (the encoder's: the Transformer encoder's alone, the GRU run named)
    [comparison] = [r for r in all_runs(client) if r.data.tags.get("attnseq.kind") == "comparison"]
    held = artifact_paths(client, comparison.info.run_id)
    beside = {paths.self_attention_beside(stack, paths.SAME_SAMPLE_HEATMAPS): stack for stack in ("encoder", "decoder")}
    assert paths.SAME_SAMPLE_HEATMAPS in held and set(beside) <= held, sorted(held)
    for artifact in beside:
        assert_png(client, comparison.info.run_id, artifact, tmp_path)

    # translate.py heatmaps=: each source's heatmap, and beside it each stack's self-attention (an RNN's none)
    by_encoder = {name: run.info.run_id for name, run in trained.items()}
    proc = run_cli(tmp_path, f"run_id={by_encoder['transformer']}", f"heatmaps={tmp_path / 'maps'}",
                   f"mlflow.tracking_uri={tracking_uri(tmp_path)}", "beam_size=2", "s3 s1 s4", "s0 s2",
                   script=TRANSLATE_PY)
    assert proc.returncode == 0, explain(proc)
    written = sorted(str(path.relative_to(tmp_path / "maps")) for path in (tmp_path / "maps").rglob("*.png"))
    assert written == sorted([f"source_{n}.png" for n in (0, 1)] + [
        f"self_attention/{stack}_source_{n}.png" for stack in ("encoder", "decoder") for n in (0, 1)])
    assert all(f"heatmap: {tmp_path / 'maps' / name}" in proc.stderr for name in written), proc.stderr
    with initialize_config_dir(config_dir=str(TRANSLATE_PY.parent / "conf"), version_base="1.3"):
        cfg = validate_translate(compose("translate", overrides=[
            f"run_id={by_encoder['gru']}", f"heatmaps={tmp_path / 'gru.png'}",
            f"mlflow.tracking_uri={tracking_uri(tmp_path)}"]))
    assert translate(cfg, ["s3 s1 s4"]).heatmaps == [tmp_path / "gru.png",
                                                     tmp_path / "self_attention" / "decoder_gru.png"]

    # the MLflow model each run logged decodes as the model library does: greedy, beam with α, the n best
    sources = ["s3 s1 s4", "s0", "s9 s8 s7 s6 s5 s4 s3 s2 s1 s0"]  # the last past the training lengths
    table = pd.DataFrame({"source": sources})
    uri = tracking_uri(tmp_path)
    for run in trained.values():
        run_id = run.info.run_id
        with logging_scope(client):
            model = mlflow.pyfunc.load_model(f"runs:/{run_id}/{paths.MLFLOW_MODEL}")
        assert model.predict(table)["output"].tolist() == expected_outputs(uri, run_id, sources)
        penalised = model.predict(table, params={"beam_size": 4, "length_penalty": 0.6})["output"].tolist()
        assert penalised == expected_outputs(uri, run_id, sources, beam_size=4, length_penalty=0.6)
        n_best = model.predict(table, params={"beam_size": 4, "length_penalty": 0.6, "n_best": 3})
        assert_n_best_as_the_library(n_best, expected_outputs(uri, run_id, sources, 4, 0.6, n_best=3))
        assert n_best["output"].tolist() == penalised
