"""encoder=transformer: its layer against torch's, positions, padding, the bridge to the decoder, and
every decoder convention × scorer × decoder cell building, stepping like it teacher-forces and training."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from model_checks import assert_same_outputs_and_gradients, forward_and_gradients, hand_self_attention
from torch import nn

from attnseq.attention import NO_ATTENTION, SCORERS, lengths_to_valid_mask
from attnseq.errors import ConfigError
from attnseq.model import ModelConfig, build_seq2seq, decoder_inputs, greedy_decode
from attnseq.model.transformer_encoder import SelfAttentionLayer, TransformerEncoder, sinusoidal_positions
from attnseq.tracking.plots import attention_heatmap

V_SRC, V_TGT = 11, 13
DECODERS = {
    "bahdanau": dict(decoder="bahdanau"),
    "luong": dict(decoder="luong", input_feeding=True),
    "luong-nofeed": dict(decoder="luong", input_feeding=False),
}


def combinations():
    """Every scorer (the no-attention baseline once) × decoder convention × decoder cell."""
    for scorer, dec, cell in itertools.product([*SCORERS, NO_ATTENTION], DECODERS, ["gru", "lstm"]):
        if scorer == NO_ATTENTION and dec != "bahdanau":
            continue
        yield pytest.param(scorer, dec, cell, id=f"{scorer}-{dec}-{cell}")


def make_model(scorer="additive", dec="bahdanau", cell="gru", heads=2, layers=1, seed=0, **options):
    torch.manual_seed(seed)
    config = ModelConfig(
        V_SRC, V_TGT, embedding_dim=8, hidden_size=12, layers=layers, cell=cell, scorer=scorer, heads=heads,
        encoder="transformer", encoder_options={"layers": 2, "heads": 3, "ff_dim": 16, **options}, **DECODERS[dec],
    )
    return build_seq2seq(config).double()


def make_batch(lengths=(6, 3, 1, 4), tgt_len=5, seed=1):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    src = torch.randint(4, V_SRC, (len(lengths), int(lengths.max())), generator=gen)
    src = src.masked_fill(~lengths_to_valid_mask(lengths), 0)
    tgt_in = torch.randint(3, V_TGT, (len(lengths), tgt_len), generator=gen)
    tgt_in[:, 0] = 1  # BOS
    return src, lengths, tgt_in


# ---------------------------------------------------------------------- the parts
def test_sinusoidal_positions_by_hand():
    table = sinusoidal_positions(3, 6, torch.float64, torch.device("cpu"))  # (T, E)
    assert table.shape == (3, 6)
    torch.testing.assert_close(table[0], torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0], dtype=torch.float64))
    for j, frequency in enumerate([1.0, 10000 ** (-2 / 6), 10000 ** (-4 / 6)]):
        assert table[2, 2 * j].item() == pytest.approx(math.sin(2 * frequency))
        assert table[2, 2 * j + 1].item() == pytest.approx(math.cos(2 * frequency))
    odd = sinusoidal_positions(2, 5, torch.float64, torch.device("cpu"))  # an odd size ends on a sine
    assert odd[1, 4].item() == pytest.approx(math.sin(10000 ** (-4 / 5)))


@pytest.mark.parametrize("heads", [1, 3])
def test_the_layer_equals_torchs_pre_norm_transformer_encoder_layer(heads):
    """``nn.TransformerEncoderLayer(norm_first=True)`` with our layer's weights, padding masked."""
    d, ff = 12, 20
    torch.manual_seed(heads)
    ours = SelfAttentionLayer(d, heads, ff, dropout=0.0).double()
    reference = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True).double()
    attention = ours.self_attention
    with torch.no_grad():
        for p in ours.parameters():  # away from the defaults (zero biases, unit norms): every copy shows
            p.normal_(0.0, 0.5)
        reference.self_attn.in_proj_weight.copy_(torch.cat([attention.W_Q.weight, attention.W_K.weight,
                                                            attention.W_V.weight]))
        reference.self_attn.in_proj_bias.copy_(torch.cat([attention.W_Q.bias, torch.randn(d).double(),
                                                          attention.W_V.bias]))  # torch's key bias: no effect
        reference.self_attn.out_proj.weight.copy_(attention.W_O.weight)
        reference.self_attn.out_proj.bias.copy_(attention.W_O.bias)
        for theirs, mine in [(reference.norm1, ours.attention_norm), (reference.norm2, ours.feed_forward_norm),
                             (reference.linear1, ours.feed_forward[0]), (reference.linear2, ours.feed_forward[3])]:
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)
    states = torch.randn(3, 5, d, dtype=torch.float64)
    valid = lengths_to_valid_mask(torch.tensor([5, 2, 4]), 5)
    torch.testing.assert_close(ours(states, valid), reference(states, src_key_padding_mask=~valid))
    normed = reference.norm1(states)  # the self-attention's weights, per head, as torch's own
    _, theirs = reference.self_attn(normed, normed, normed, key_padding_mask=~valid, need_weights=True,
                                    average_attn_weights=False)  # (B, H, T, T)
    torch.testing.assert_close(ours.attend(states, valid)[1], theirs)


def test_keys_are_zero_at_padding_and_the_decoder_starts_from_the_mean_of_the_real_states():
    torch.manual_seed(0)
    encoder = TransformerEncoder(V_SRC, 8, 12, layers=2, heads=3, ff_dim=16, dropout=0.0,
                                 decoder_cell="lstm", decoder_layers=2).double()
    src, lengths, _ = make_batch()
    keys, (h, c) = encoder(src, lengths)
    assert keys.shape == (4, 6, 12) and h.shape == c.shape == (2, 4, 12)
    assert encoder.key_dim == 12
    for b, n in enumerate(lengths.tolist()):
        assert torch.all(keys[b, n:] == 0)
        initial = torch.tanh(encoder.bridge(keys[b, :n].mean(0))).view(2, 2, 12)  # (h/c, L, d)
        torch.testing.assert_close(h[:, b], initial[0])
        torch.testing.assert_close(c[:, b], initial[1])


# ---------------------------------------------------------------------- every combination
@pytest.mark.parametrize("scorer,dec,cell", combinations())
def test_padding_changes_nothing_for_the_real_tokens(scorer, dec, cell):
    """Extra padding columns, and garbage (real token ids) in the padded positions: the same keys,
    initial state, logits and attention over the real tokens; and each sequence alone gives the same."""
    model = make_model(scorer, dec, cell, layers=2).eval()
    src, lengths, tgt_in = make_batch()
    keys, _ = model.encoder(src, lengths)
    logits, weights = model(src, lengths, tgt_in)

    wider = torch.cat([src, torch.zeros(4, 3, dtype=src.dtype)], dim=1)  # (B, T_enc + 3)
    garbage = torch.where(lengths_to_valid_mask(lengths, 9), wider, torch.randint(4, V_SRC, wider.shape))
    for padded in (wider, garbage):
        padded_keys, _ = model.encoder(padded, lengths)
        padded_logits, padded_weights = model(padded, lengths, tgt_in)
        torch.testing.assert_close(padded_keys[:, :6], keys)
        assert torch.all(padded_keys[:, 6:] == 0)
        torch.testing.assert_close(padded_logits, logits)
        if weights is not None:
            torch.testing.assert_close(padded_weights[..., :6], weights)
            assert torch.all(padded_weights[..., 6:] == 0)
    decoded = greedy_decode(model, src, lengths, max_length=7, check_every=100)
    for b in range(4):
        n = int(lengths[b])
        alone_logits, _ = model(src[b : b + 1, :n], lengths[b : b + 1], tgt_in[b : b + 1])
        torch.testing.assert_close(alone_logits[0], logits[b])
        alone = greedy_decode(model, src[b : b + 1, :n], lengths[b : b + 1], max_length=7, check_every=100)
        assert torch.equal(alone.tokens[0], decoded.tokens[b])


@pytest.mark.parametrize("scorer,dec,cell", combinations())
def test_teacher_forcing_equals_stepping_values_and_gradients(scorer, dec, cell):
    model = make_model(scorer, dec, cell, layers=1).train()
    assert_same_outputs_and_gradients(*forward_and_gradients(model, *make_batch()))


@pytest.mark.parametrize("scorer,dec,cell", combinations())
def test_one_training_step_is_finite_reaches_every_parameter_and_changes_them(scorer, dec, cell):
    model = make_model(scorer, dec, cell, layers=2).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    src, lengths, tgt_in = make_batch()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    logits, _ = model(src, lengths, tgt_in)
    loss = nn.functional.cross_entropy(logits.reshape(-1, V_TGT), tgt_in.roll(-1, 1).reshape(-1))
    assert torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if "embedding" not in name:  # rows of unused tokens legitimately get zero gradient
            assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"
    optimizer.step()
    assert all(not torch.equal(p, before[name]) for name, p in model.named_parameters()), "a parameter did not move"


# ---------------------------------------------------------------------- the config
@pytest.mark.parametrize(
    ("options", "bidirectional", "fragments"),
    [
        ({"heads": 5}, False, ["encoder.heads=5 does not divide model.hidden_size=12", "one of [1, 2, 3, 4, 6, 12]"]),
        ({"ff_dim": 0}, False, ["encoder.ff_dim=0 must be a whole number ≥ 1"]),
        ({"layers": 0}, False, ["encoder.layers=0"]),
        ({"depth": 2}, False, ["encoder.depth is not a setting", "encoder.layers"]),
        ({}, True, ["encoder.bidirectional=true with encoder=transformer"]),
    ],
)
def test_settings_that_cannot_work_are_rejected_before_building(options, bidirectional, fragments):
    config = ModelConfig(V_SRC, V_TGT, hidden_size=12, bidirectional=bidirectional, encoder="transformer",
                         encoder_options=options)
    with pytest.raises(ConfigError) as caught:
        config.validate()
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_an_unknown_encoder_kind_lists_the_known_ones():
    with pytest.raises(ConfigError) as caught:
        ModelConfig(V_SRC, V_TGT, encoder="mamba").validate()
    assert "encoder.kind=mamba" in str(caught.value) and "rnn, transformer" in caught.value.fix


def test_a_recurrent_encoder_takes_no_transformer_settings():
    with pytest.raises(ConfigError, match="encoder.heads is not a setting of encoder.kind=rnn"):
        ModelConfig(V_SRC, V_TGT, encoder_options={"heads": 4}).validate()


def test_a_saved_config_from_before_encoder_kinds_loads_as_recurrent():
    saved = {"src_vocab_size": V_SRC, "tgt_vocab_size": V_TGT, "cell": "lstm", "scorer": "dot", "heads": 1,
             "decoder": "luong", "input_feeding": True}
    config = ModelConfig.from_saved(saved)
    assert (config.encoder, dict(config.encoder_options)) == ("rnn", {})
    assert type(build_seq2seq(config).encoder).__name__ == "RNNEncoder"


# ---------------------------------------------------------------------- heatmaps per head
def test_a_four_head_multihead_models_heatmap_has_the_mean_and_each_head():
    """What the training's heatmap artifact draws (``RunArtifacts.log_heatmaps``) for model.heads=4:
    a panel of the mean over heads, then one per head, each showing that head's own weights."""
    model = make_model("multihead", "luong", heads=4).eval()
    src, lengths, _ = make_batch()
    decoded = greedy_decode(model, src, lengths, max_length=5)
    n_src, n_out = int(lengths[0]), int(decoded.lengths[0])
    weights = decoded.attention[0, :, :n_out, :n_src].float().numpy()  # (H, T_out, T_src)
    assert weights.shape[0] == 4
    figure = attention_heatmap(weights, [f"s{i}" for i in range(n_src)], [f"o{t}" for t in range(n_out)], "4 heads")
    panels = [ax for ax in figure.axes if ax.images]
    assert [ax.get_title() for ax in panels] == ["mean over heads", "head 0", "head 1", "head 2", "head 3"]
    torch.testing.assert_close(torch.tensor(panels[0].images[0].get_array()), torch.tensor(weights.mean(0)))
    for h in range(4):
        torch.testing.assert_close(torch.tensor(panels[h + 1].images[0].get_array()), torch.tensor(weights[h]))


# ---------------------------------------------------------------------- self-attention maps
def test_the_self_attention_maps_are_each_layers_softmax_of_its_own_weights_by_hand():
    """``Seq2Seq.self_attention``: per layer ``(B, H, T_enc, T_enc)``, softmax(Q Kᵀ / √d_h) from the
    layer's own weights with the padded keys masked (exactly 0), rows summing to 1; an RNN decoder has none."""
    model = make_model("additive", "bahdanau").eval()
    src, lengths, tgt_in = make_batch()
    with torch.no_grad():
        maps = model.self_attention(src, lengths, tgt_in)
        assert model.config.self_attending == (True, False) and maps.decoder == ()
        encoder = model.encoder
        valid = lengths_to_valid_mask(lengths, src.shape[1])  # (B, T)
        states = encoder.embed(src)  # (B, T, d)
        assert len(maps.encoder) == len(encoder.layers) == 2
        for layer, weights in zip(encoder.layers, maps.encoder):
            assert weights.shape == (4, 3, 6, 6)
            expected = hand_self_attention(layer.self_attention, layer.attention_norm, states,
                                           valid[:, None, :].expand(-1, 6, -1))  # (B, H, T, T)
            torch.testing.assert_close(weights, expected)
            padded_keys = ~valid[:, None, None, :].expand_as(weights)
            assert torch.all(weights[padded_keys] == 0)
            torch.testing.assert_close(weights.sum(-1), torch.ones(4, 3, 6, dtype=torch.float64))
            states = layer(states, valid)  # (B, T, d): the next layer's input
        row = maps.of_row(1, int(lengths[1]), 4)
        assert list(row) == ["encoder"] and [m.shape for m in row["encoder"]] == [(3, 3, 3)] * 2
        decoded = greedy_decode(model, src, lengths, max_length=5)
        again = model.self_attention(src, lengths, decoder_inputs(decoded.tokens))  # the decoded target's
    for first, second in zip(maps.encoder, again.encoder):
        torch.testing.assert_close(first, second)  # the encoder's maps read the source alone


def test_a_recurrent_model_has_no_self_attention():
    config = ModelConfig(V_SRC, V_TGT, embedding_dim=8, hidden_size=12, scorer="additive", decoder="bahdanau")
    model = build_seq2seq(config)
    src, lengths, tgt_in = make_batch()
    assert config.self_attending == (False, False)
    maps = model.self_attention(src, lengths, tgt_in)
    assert maps.encoder == () and maps.decoder == () and maps.of_row(0, 6, 5) == {}
