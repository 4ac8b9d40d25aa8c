"""The attention explorer's data (``attnseq.faithfulness.explorer``) as embedded in its page
(``attnseq.tracking.explorer``), against independent computations: the attention of step-by-step greedy
decoding, gradient × input by ``torch.autograd`` through the embedding matrix, leave-one-out by a plain loop
of shortened sources, Kendall τ by scipy, and a Transformer's self-attention."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau

from attnseq.data import Example
from attnseq.data.vocab import Vocabulary
from attnseq.faithfulness.explorer import DIGITS, explorer_samples
from attnseq.metrics.faithfulness import ImportanceSettings
from attnseq.model import ModelConfig, build_seq2seq, greedy_decode
from attnseq.tracking.explorer import explorer_data, explorer_html

TOLERANCE = 0.6 * 10**-DIGITS  # what rounding to DIGITS decimals may move a value
SYMBOLS = [f"s{i}" for i in range(7)]
EXAMPLES = [Example(src="s1 s2 s3".split(), tgt="s1 s2 s3".split(), alignment=[0, 1, 2]),
            Example(src="s4 s0 s6 s2 s5".split(), tgt="s4 s0 s6 s2 s5".split(), alignment=[0, 1, 2, 3, 4]),
            Example(src=["s3"], tgt=["s3"], alignment=[0])]
MAX_LENGTH = 7


def model_of(**options):
    torch.manual_seed(5)
    vocab = Vocabulary(SYMBOLS)
    config = ModelConfig(len(vocab), len(vocab), embedding_dim=8, hidden_size=16, **options)
    return build_seq2seq(config).double().eval(), vocab


def probabilities(model, tokens, tgt_in):
    with torch.no_grad():
        logits, _ = model(torch.tensor([tokens]), torch.tensor([len(tokens)]), tgt_in)
    return logits[0].softmax(-1)  # (T, V)


def test_the_page_carries_the_models_attention_and_importance_for_its_samples():
    model, vocab = model_of(scorer="additive", heads=2)
    settings = ImportanceSettings(measures=("grad_x_input", "leave_one_out"))
    found = explorer_samples(model, EXAMPLES, vocab, vocab, MAX_LENGTH, settings, labels=["a", "b", "c"])
    page = explorer_html("test", [{"label": "final", "samples": found}])
    [epoch] = explorer_data(page)["epochs"]
    assert [s["label"] for s in epoch["samples"]] == ["a", "b", "c"]
    for example, shown in zip(EXAMPLES, epoch["samples"]):
        ids = vocab.encode(example.src)
        decoded = greedy_decode(model, torch.tensor([ids]), torch.tensor([len(ids)]), max_length=MAX_LENGTH)
        n_out = int(decoded.lengths[0])
        out_ids = decoded.tokens[0, :n_out].tolist()
        assert shown["source"] == example.src and shown["output"] == vocab.decode(out_ids)
        assert shown["gold"] == [example.alignment[t] if t < len(example.alignment) else -1 for t in range(n_out)]
        attention = decoded.attention[0, :, :n_out].numpy()  # (H, T_out, T_src): step by step, not teacher forced
        np.testing.assert_allclose(np.array(shown["attention"]), attention, atol=TOLERANCE)
        tgt_in = torch.tensor([[1, *out_ids[:-1]]])  # BOS, then the output: the steps greedy decoding took
        original = probabilities(model, ids, tgt_in)  # (T_out, V)
        for t in range(n_out):
            if len(ids) < 2:  # one token: nothing to rank, nothing to delete
                assert shown["importance"]["leave_one_out"][t] is None and shown["tau"]["grad_x_input"][t] is None
                continue
            token = int(original[t].argmax())
            weight = model.encoder.embedding.weight.detach().clone().requires_grad_()  # (V_src, E)
            logits, _ = torch.func.functional_call(model, {"encoder.embedding.weight": weight},
                                                   (torch.tensor([ids]), torch.tensor([len(ids)]), tgt_in))
            (grad,) = torch.autograd.grad(logits[0, t].softmax(-1)[token], weight)  # (V_src, E)
            gx = (grad[ids] * weight.detach()[ids]).sum(-1).abs().numpy()  # (n,): the tokens are distinct
            np.testing.assert_allclose(shown["importance"]["grad_x_input"][t], gx, atol=TOLERANCE)
            loo = [0.5 * float((original[t] - probabilities(model, ids[:i] + ids[i + 1:], tgt_in)[t]).abs().sum())
                   for i in range(len(ids))]
            np.testing.assert_allclose(shown["importance"]["leave_one_out"][t], loo, atol=TOLERANCE)
            tau = kendalltau(attention[:, t].mean(0), gx).statistic
            assert shown["tau"]["grad_x_input"][t] == pytest.approx(tau, abs=TOLERANCE)
        assert shown["self_attention"] == {}  # an RNN has none


def test_a_transformers_self_attention_and_layered_heads_are_carried_and_measures_can_be_left_out():
    model, vocab = model_of(scorer="multihead", heads=2, encoder="transformer", decoder="transformer",
                            encoder_options={"layers": 2, "heads": 2, "ff_dim": 16},
                            decoder_options={"layers": 2, "heads": 2, "ff_dim": 16})
    examples = EXAMPLES[:2]
    [shown, _] = explorer_data(explorer_html("t", [{"label": "final", "samples": explorer_samples(
        model, examples, vocab, vocab, MAX_LENGTH, ImportanceSettings(ig_steps=4))}]))["epochs"][0]["samples"]
    assert shown["heads"] == model.decoder.head_labels(len(shown["attention"]))
    assert set(shown["importance"]) == {"grad_x_input", "integrated_gradients", "leave_one_out"}
    ids = vocab.encode(examples[0].src)
    out = vocab.encode(shown["output"])
    maps = model.sequence_self_attention(torch.tensor(ids), torch.tensor(out))
    assert set(shown["self_attention"]) == {"encoder", "decoder"}
    for stack, layers in maps.items():
        assert len(shown["self_attention"][stack]) == 2
        for mine, theirs in zip(shown["self_attention"][stack], layers):
            np.testing.assert_allclose(np.array(mine), theirs, atol=TOLERANCE)
    [bare, _] = explorer_samples(model, examples, vocab, vocab, MAX_LENGTH, ImportanceSettings(), measures=False)
    assert bare["importance"] == {} and bare["self_attention"] == {}
    np.testing.assert_allclose(bare["attention"], shown["attention"], atol=TOLERANCE)


def test_the_page_is_self_contained_and_its_data_cannot_close_the_script():
    model, vocab = model_of()
    found = explorer_samples(model, EXAMPLES[:1], vocab, vocab, MAX_LENGTH, ImportanceSettings(ig_steps=2))
    found[0]["label"] = "</script><b>x"
    page = explorer_html("a <title>", [{"label": "e", "samples": found}])
    assert explorer_data(page)["epochs"][0]["samples"][0]["label"] == "</script><b>x"
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched: no network
    assert "<title>a &lt;title&gt;</title>" in page


def test_the_comparison_page_carries_each_runs_attention_teacher_forced_with_the_reference():
    """``reference_attention`` against a step-by-step loop over the reference (``decoder.step``), for two models."""
    from attnseq.faithfulness.explorer import reference_attention
    from attnseq.tracking.explorer import comparison_explorer_html

    models = [model_of(scorer="additive", heads=2)[0], model_of(scorer="dot")[0]]
    vocab = model_of()[1]
    forced = [reference_attention(model, EXAMPLES, vocab, vocab) for model in models]
    samples = [{"label": f"e{k}", "source": e.src, "rows": [*e.tgt, "</s>"], "gold": [*e.alignment, -1],
                "attention": [by_model[k].tolist() for by_model in forced]} for k, e in enumerate(EXAMPLES)]
    data = explorer_data(comparison_explorer_html("c", ["additive", "dot"], samples))
    assert data["compare"]["runs"] == ["additive", "dot"] and data["epochs"] == []
    for model, by_model in zip(models, zip(*(s["attention"] for s in data["compare"]["samples"]))):
        for example, shown in zip(EXAMPLES, by_model):
            ids, tokens = vocab.encode(example.src), [1, *vocab.encode(example.tgt)]  # BOS, then the reference
            with torch.no_grad():
                memory, state = model.encode(torch.tensor([ids]), torch.tensor([len(ids)]))
                rows = []
                for token in tokens:
                    _, weights, state = model.decoder.step(torch.tensor([token]), state, memory)  # (1, H, T_src)
                    rows.append(weights[0].mean(0).numpy())
            np.testing.assert_allclose(np.array(shown), np.stack(rows), atol=TOLERANCE)
