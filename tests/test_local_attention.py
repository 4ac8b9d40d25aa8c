"""Luong's local attention (local-m, local-p; Luong, Pham & Manning 2015, eq. 9-10) against a NumPy
loop written from the paper's equations: every batch entry, step and source position in turn, the
padding of a batch with different source lengths included; through the Attention call and through
both decoder conventions; and one training through the real CLI."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import artifact_paths, explain, tiny
from conftest import train_once
from model_checks import padded_batch, step_by_step

from attnseq.attention import build_attention, lengths_to_valid_mask
from attnseq.attention.local import MonotonicWindow, PredictiveWindow
from attnseq.attention.settings import MonotonicSettings, PredictiveSettings
from attnseq.model import build_seq2seq
from attnseq.model.config import ModelConfig
from attnseq.model.saved import load_saved_model

D_Q = 8  # query size = key size, so that dot works
LENGTHS = (6, 3, 1, 5)  # different source lengths: padding in every row but the first
KINDS = {"monotonic": MonotonicSettings, "predictive": PredictiveSettings}
SCORERS = ("dot", "general", "additive")


# -- the reference: the paper's equations, one number at a time --------------------------------------------------
def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def numpy_score(attention, name: str, query: np.ndarray, key: np.ndarray, head: int) -> float:
    """score(h_t, h̄_s) of one head (the head owns a slice of the key; docs/attention.md)."""
    d_h = attention.head_dim
    keys = slice(head * d_h, (head + 1) * d_h)
    if name == "dot":
        return float(query[keys] @ key[keys])
    if name == "general":
        W = attention.W.detach().double().numpy()  # (d_q, d_k)
        return float(query @ W[:, keys] @ key[keys])
    W_a, U_a, v_a = (p.detach().double().numpy() for p in (attention.W_a, attention.U_a, attention.v_a))
    a = attention.head_attn_dim
    rows = slice(head * a, (head + 1) * a)
    return float(v_a[rows] @ np.tanh(W_a[rows] @ query + U_a[rows] @ key[keys]))


def numpy_local(attention, name: str, kind: str, D: int, queries: np.ndarray, keys: np.ndarray,
                lengths: list[int], first_step: int) -> tuple[np.ndarray, np.ndarray]:
    """Luong §3.2: p_t = t (local-m) or S·sigmoid(v_pᵀ tanh(W_p h_t)) (eq. 9); a_t = softmax of the
    scores over the window [p_t − D, p_t + D] ∩ the real source; local-p × exp(−(s − p_t)²/2σ²), σ = D/2
    (eq. 10). queries (B, T_dec, d_q), keys (B, T_enc, d_k) → weights (B, H, T_dec, T_enc), contexts
    (B, T_dec, d_k)."""
    batch, steps, _ = queries.shape
    t_enc, d_k = keys.shape[1], keys.shape[2]
    heads, d_h = attention.heads, attention.head_dim
    weights = np.zeros((batch, heads, steps, t_enc))
    contexts = np.zeros((batch, steps, d_k))
    if kind == "predictive":
        W_p = attention.window.W_p.detach().double().numpy()
        v_p = attention.window.v_p.detach().double().numpy()
    for b in range(batch):
        S = lengths[b]
        for t in range(steps):
            h_t = queries[b, t]
            if kind == "monotonic":
                p_t = float(first_step + t)
            else:
                p_t = S * sigmoid(float(v_p @ np.tanh(W_p @ h_t)))
            window = [s for s in range(S) if p_t - D <= s <= p_t + D]
            for head in range(heads):
                scores = {s: numpy_score(attention, name, h_t, keys[b, s], head) for s in window}
                if not scores:
                    continue  # an empty window: no weight anywhere, a zero context
                top = max(scores.values())
                total = sum(math.exp(e - top) for e in scores.values())
                for s, e in scores.items():
                    align = math.exp(e - top) / total
                    if kind == "predictive":
                        sigma = D / 2
                        align *= math.exp(-((s - p_t) ** 2) / (2 * sigma**2))
                    weights[b, head, t, s] = align
                    contexts[b, t, head * d_h:(head + 1) * d_h] += align * keys[b, s, head * d_h:(head + 1) * d_h]
    return weights, contexts


def local_attention(name: str, kind: str, D: int, heads: int, seed: int = 0):
    torch.manual_seed(seed)
    return build_attention(name, D_Q, D_Q, heads=heads, local=KINDS[kind](window=D)).double()


def batch(steps: int, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(LENGTHS)
    t_enc = max(LENGTHS)
    keys = torch.randn(len(LENGTHS), t_enc, D_Q, generator=generator, dtype=torch.float64)  # (B, T_enc, d_k)
    keys = keys.masked_fill(~lengths_to_valid_mask(lengths, t_enc)[..., None], 7.0)  # padding holds junk
    queries = torch.randn(len(LENGTHS), steps, D_Q, generator=generator, dtype=torch.float64)  # (B, T_dec, d_q)
    return queries, keys, lengths


# -- the attention call ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("D", [1, 2, 4])
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("name", SCORERS)
def test_local_attention_is_the_papers_equations(name, kind, D, heads):
    attention = local_attention(name, kind, D, heads)
    queries, keys, lengths = batch(steps=8)  # steps past the longest source: local-m's window leaves it
    valid = lengths_to_valid_mask(lengths, keys.shape[1])  # (B, T_enc)
    for first_step in (0, 3):
        context, weights = attention(queries, keys, valid, step=first_step)  # all steps at once
        ref_weights, ref_context = numpy_local(attention, name, kind, D, queries.numpy(), keys.numpy(),
                                               lengths.tolist(), first_step)
        np.testing.assert_allclose(weights.detach().numpy(), ref_weights, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(context.detach().numpy(), ref_context, rtol=1e-10, atol=1e-12)
        for t in range(queries.shape[1]):  # one step at a time, as a decoder calls it
            step_context, step_weights = attention(queries[:, t], keys, valid, step=first_step + t)
            np.testing.assert_allclose(step_weights.detach().numpy(), ref_weights[:, :, t], rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(step_context.detach().numpy(), ref_context[:, t], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_weights_are_zero_outside_the_window_and_on_padding(kind):
    D = 1
    attention = local_attention("general", kind, D, heads=2)
    queries, keys, lengths = batch(steps=6)
    valid = lengths_to_valid_mask(lengths, keys.shape[1])  # (B, T_enc)
    _, weights = attention(queries, keys, valid, step=0)  # (B, H, T_dec, T_enc)
    centres = attention.window.centres(queries, valid, 0)  # (B, T_dec)
    positions = torch.arange(keys.shape[1], dtype=centres.dtype)  # (T_enc,)
    outside = ((positions - centres[..., None]).abs() > D) | ~valid[:, None, :]  # (B, T_dec, T_enc)
    assert outside.any() and (~outside).any()
    assert (weights.masked_select(outside[:, None].expand_as(weights)) == 0).all()
    assert (weights.masked_select(~outside[:, None].expand_as(weights)) > 0).all()
    sums = weights.sum(-1)  # (B, H, T_dec)
    has_window = (~outside).any(-1)[:, None].expand_as(sums)  # (B, H, T_dec)
    if kind == "monotonic":  # a softmax inside the window: sums to one wherever it has a real position
        torch.testing.assert_close(sums[has_window], torch.ones_like(sums[has_window]))
    else:  # eq. 10: times the Gaussian, not renormalised
        assert (sums[has_window] <= 1 + 1e-12).all() and (sums[has_window] < 1 - 1e-6).any()


def test_every_head_shares_the_window():
    attention = local_attention("additive", "predictive", 2, heads=2)
    queries, keys, lengths = batch(steps=5)
    _, weights = attention(queries, keys, lengths_to_valid_mask(lengths, keys.shape[1]))  # (B, H, T_dec, T_enc)
    assert torch.equal(weights[:, 0] > 0, weights[:, 1] > 0)
    assert not torch.allclose(weights[:, 0], weights[:, 1])  # each head its own scores


@pytest.mark.parametrize("name", SCORERS)
def test_local_m_with_a_window_past_the_source_is_global_attention(name):
    queries, keys, lengths = batch(steps=5)
    valid = lengths_to_valid_mask(lengths, keys.shape[1])  # (B, T_enc)
    wide = local_attention(name, "monotonic", D=max(LENGTHS) + queries.shape[1], heads=2)
    torch.manual_seed(0)
    plain = build_attention(name, D_Q, D_Q, heads=2).double()
    plain.load_state_dict(wide.state_dict())
    for got, want in zip(wide(queries, keys, valid, step=0), plain(queries, keys, valid)):
        torch.testing.assert_close(got, want)


def test_gradients_reach_the_position_predictor():
    attention = local_attention("general", "predictive", 2, heads=1)
    queries, keys, lengths = batch(steps=4)
    context, weights = attention(queries, keys, lengths_to_valid_mask(lengths, keys.shape[1]))
    (context.sin().sum() + weights.sum()).backward()
    for parameter in (attention.window.W_p, attention.window.v_p):
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0
    names = {name for name, _ in attention.named_parameters()}
    assert {"window.W_p", "window.v_p"} <= names  # the attention module's own, saved with the model


def test_local_m_needs_the_step():
    attention = local_attention("dot", "monotonic", 2, heads=1)
    queries, keys, lengths = batch(steps=2)
    with pytest.raises(ValueError, match="step"):
        attention(queries, keys, lengths_to_valid_mask(lengths, keys.shape[1]))


# -- through the decoders ----------------------------------------------------------------------------------------
CONVENTIONS = [("bahdanau", None), ("luong", True), ("luong", False)]


def local_model(name: str, kind: str, decoder: str, feeding: bool | None, heads: int = 1, D: int = 1):
    torch.manual_seed(0)
    config = ModelConfig(11, 13, embedding_dim=6, hidden_size=D_Q, scorer=name, heads=heads, decoder=decoder,
                         input_feeding=feeding, local=kind, window=D)
    return build_seq2seq(config).double()


@pytest.mark.parametrize(("decoder", "feeding"), CONVENTIONS, ids=["bahdanau", "luong-feed", "luong-nofeed"])
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize(("name", "heads"), [("general", 1), ("additive", 2), ("dot", 2)])
def test_each_decoder_convention_attends_within_the_papers_window(name, heads, kind, decoder, feeding):
    """The queries the decoder sends (s_{t-1} for Bahdanau, s_t for Luong), with p_t = t the index of the
    target token the step produces in both, give the reference's weights; teacher forcing (whichever
    path it takes) equals stepping."""
    model = local_model(name, kind, decoder, feeding, heads)
    src, lengths, tgt_in = padded_batch(lengths=LENGTHS, tgt_len=8)
    sent: list[torch.Tensor] = []
    hook = model.attention.register_forward_pre_hook(lambda module, args: sent.append(args[0]))
    with torch.no_grad():
        _, stepped = step_by_step(model, src, lengths, tgt_in)  # (B, H, T_dec, T_enc)
    hook.remove()
    queries = torch.stack(sent, dim=1)  # (B, T_dec, d_q): one query per step
    memory, _ = model.encode(src, lengths)
    ref_weights, _ = numpy_local(model.attention, name, kind, 1, queries.numpy(), memory.keys.detach().numpy(),
                                 lengths.tolist(), first_step=0)
    np.testing.assert_allclose(stepped.numpy(), ref_weights, rtol=1e-9, atol=1e-12)
    assert model.decoder.takes_fast_path() == (decoder == "luong" and not feeding)  # all steps in one call
    with torch.no_grad():
        _, forced = model(src, lengths, tgt_in)  # (B, H, T_dec, T_enc)
    torch.testing.assert_close(forced, stepped)


def test_the_fast_path_choice_reads_the_declared_capability(monkeypatch):
    model = local_model("additive", "monotonic", "bahdanau", None)
    assert not model.attention.fuses and not model.decoder.takes_fast_path()
    monkeypatch.setattr(MonotonicWindow, "fuses", True)  # a kind that declared the fused loops compute it
    assert model.attention.fuses and model.decoder.takes_fast_path()
    global_model = local_model("additive", "none", "bahdanau", None, D=None)
    assert global_model.attention.fuses and global_model.decoder.takes_fast_path()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_greedy_and_beam_decoding_count_the_steps(kind):
    """Each decoded step attends where teacher forcing on the decoded tokens does: the step index
    travels in the decoder state, through the beam's reordering too."""
    from attnseq.model.beam import beam_search
    from attnseq.model.decoding import greedy_decode

    model = local_model("general", kind, "luong", True).eval()
    src, lengths, _ = padded_batch(lengths=LENGTHS, tgt_len=8)
    greedy = greedy_decode(model, src, lengths, max_length=7, eos_id=-1)  # no EOS: 7 steps
    beam = beam_search(model, src, lengths, beam_size=3, max_length=7, eos_id=-1, greedy_fallback=False)
    for decoded in (greedy, beam):
        bos = torch.ones_like(decoded.tokens[:, :1])  # (B, 1)
        with torch.no_grad():
            _, forced = model(src, lengths, torch.cat([bos, decoded.tokens[:, :-1]], dim=1))  # (B, H, T_out, T_enc)
        torch.testing.assert_close(decoded.attention, forced)


# -- the CLI -----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_train_logs_a_local_p_run(tmp_path):
    trained = train_once(tmp_path, *tiny(max_epochs=1), "scorer=general", "decoder=luong",
                         "attention.local=predictive", "attention.window=3")
    assert trained.proc.returncode == 0, explain(trained.proc)
    (run,) = trained.runs
    assert run.data.params["attention.local"] == "predictive"
    assert run.data.params["attention.window"] == "3"
    assert "local-predictive" in run.info.run_name
    metrics = run.data.metrics
    assert "val/exact_match" in metrics and "val/aer" in metrics  # the alignment metrics read the local weights
    images = artifact_paths(trained.client, run.info.run_id, "images")
    assert any(path.startswith("images/attention~") for path in images)  # the heatmaps too
    model = load_saved_model(trained.client.download_artifacts(run.info.run_id, "weights/model.pt", str(tmp_path)))
    assert isinstance(model.attention.window, PredictiveWindow) and model.attention.window.half_width == 3


# -- the config ----------------------------------------------------------------------------------------------------
def test_the_bottleneck_local_rows_are_local_p_and_local_m_with_general(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from attnseq.attention.settings import LOCAL_ATTENTION
    from attnseq.config import validate_train

    conf = Path(__file__).resolve().parents[1] / "conf"
    overrides = ["experiment=bottleneck_local", f"paths.output_dir={tmp_path}",
                 f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db"]
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        (sweep,) = parser.parse_overrides([f"attention.local={cfg.hydra.sweeper.params['attention.local']}"])
        swept = list(sweep.sweep_string_iterator())
        for kind in swept:
            job = compose("train", overrides=[*overrides, f"attention.local={kind}"])
            typed = validate_train(job)
            assert typed.scorer.name == "general" and typed.attention.local == kind
            assert typed.attention.half_width == 10
    assert sorted(swept) == sorted(set(LOCAL_ATTENTION) - {"none"})  # every local kind


@pytest.mark.parametrize("overrides", [("attention.window=5",), ("scorer=none", "attention.local=monotonic"),
                                       ("attention.local=predictiv",)])
def test_a_local_attention_that_cannot_work_stops_before_training(tmp_path, overrides):
    from cli_helpers import outputs_under, run_cli, user_env

    proc = run_cli(tmp_path, *overrides, *outputs_under(tmp_path), env=user_env())
    assert proc.returncode == 2, explain(proc)
    assert "attention." in proc.stderr and "Fix:" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_the_counterfactual_check_permutes_the_local_weights():
    from attnseq.faithfulness.counterfactual import counterfactual_decoder

    model = local_model("general", "monotonic", "luong", False, D=1)  # the states do not read the attention
    src, lengths, tgt_in = padded_batch(lengths=LENGTHS, tgt_len=6)
    with torch.no_grad():
        _, real = step_by_step(model, src, lengths, tgt_in)  # (B, H, T_dec, T_enc)
        model.decoder = counterfactual_decoder(model.decoder, "permute", torch.Generator().manual_seed(0))
        _, permuted = step_by_step(model, src, lengths, tgt_in)  # (B, H, T_dec, T_enc)
    torch.testing.assert_close(permuted.sort(-1).values, real.sort(-1).values)  # the same weights, moved
    assert not torch.equal(permuted, real)
