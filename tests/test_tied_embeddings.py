"""Tied and shared embeddings (``model.tie_output``, ``model.share_embeddings``): one Parameter under
two (or three) names, counted once; its gradient the sum of the gradients an untied model with the
matrices set equal gives each use; saved and loaded tied; refused where the vocabularies differ; and
one run through the real CLI."""

from __future__ import annotations

import copy
from dataclasses import asdict

import pytest
import torch
from cli_helpers import explain, tiny
from conftest import train_once
from model_checks import padded_batch, step_by_step
from torch import nn

from attnseq.data.tasks import TASKS
from attnseq.data.vocab import Vocabulary
from attnseq.errors import ConfigError
from attnseq.model import ModelConfig, build_seq2seq, greedy_decode
from attnseq.model.decoders import TiedOutput
from attnseq.model.saved import load_saved_model

V = 13  # one vocabulary for both sides, so that sharing can be tried on every case
HIDDEN = 16
DECODERS = {
    "bahdanau": dict(decoder="bahdanau"),
    "bahdanau-lstm": dict(decoder="bahdanau", cell="lstm"),
    "luong": dict(decoder="luong", input_feeding=True, scorer="general"),
    "luong-nofeed": dict(decoder="luong", input_feeding=False),
    "transformer": dict(decoder="transformer", scorer="multihead", encoder="transformer"),
    "transformer-gru": dict(decoder="transformer", scorer="multihead"),
    "plain": dict(scorer="none"),
}


def output_width(case: str, embedding_dim: int) -> int:
    """The features each decoder reads its logits from (attnseq.model.decoders): Bahdanau's
    [s_t; c_t; E y_{t-1}], the others' state of width d."""
    return 2 * HIDDEN + embedding_dim if case.startswith("bahdanau") else HIDDEN


def config(case: str, embedding_dim: int = 8, **tying) -> ModelConfig:
    options = dict(DECODERS[case])
    encoder = options.pop("encoder", "rnn")
    encoder_options = {"layers": 1, "heads": 2, "ff_dim": 32} if encoder == "transformer" else {}
    decoder_options = {"layers": 2, "heads": 2, "ff_dim": 32} if options.get("decoder") == "transformer" else {}
    return ModelConfig(V, V, embedding_dim=embedding_dim, hidden_size=HIDDEN, encoder=encoder,
                       encoder_options=encoder_options, decoder_options=decoder_options, **options, **tying)


def built(case: str, embedding_dim: int = 8, seed: int = 0, **tying) -> nn.Module:
    torch.manual_seed(seed)
    return build_seq2seq(config(case, embedding_dim, **tying)).double().eval()


def tied_outputs(model) -> list[TiedOutput]:
    return [module for module in model.decoder.modules() if isinstance(module, TiedOutput)]


CASES = [pytest.param(case, e, id=f"{case}-E{e}") for case in DECODERS for e in (8, 16)]


@pytest.mark.parametrize("case, embedding_dim", CASES)
def test_the_output_layer_is_the_target_embeddings_parameter(case, embedding_dim):
    model = built(case, embedding_dim, tie_output=True)
    [tied] = tied_outputs(model)
    assert tied.output.weight is model.decoder.embedding.weight
    assert isinstance(tied.output.weight, nn.Parameter)
    shared = [name for name, p in model.named_parameters(remove_duplicate=False) if p is tied.output.weight]
    assert len(shared) == 2  # two names, one Parameter: counted once by parameters()
    assert sum(p is tied.output.weight for p in model.parameters()) == 1
    width = output_width(case, embedding_dim)
    assert isinstance(tied.projection, nn.Identity) == (width == embedding_dim)
    assert built(case, embedding_dim).encoder.embedding.weight is not model.decoder.embedding.weight


@pytest.mark.parametrize("case, embedding_dim", CASES)
def test_tying_and_sharing_drop_the_expected_number_of_parameters(case, embedding_dim):
    untied = built(case, embedding_dim).num_parameters()
    width = output_width(case, embedding_dim)
    # the V × width output matrix goes; a bias-free width → E projection comes where width ≠ E
    tie_saves = V * width - (embedding_dim * width if width != embedding_dim else 0)
    assert untied - built(case, embedding_dim, tie_output=True).num_parameters() == tie_saves
    assert untied - built(case, embedding_dim, share_embeddings=True).num_parameters() == V * embedding_dim
    both = built(case, embedding_dim, tie_output=True, share_embeddings=True)
    assert untied - both.num_parameters() == tie_saves + V * embedding_dim
    assert sum(p.numel() for p in both.parameters()) == both.num_parameters()


def untied_copy(model) -> tuple[nn.Module, list[str]]:
    """A copy of ``model`` whose tied matrices are separate Parameters of equal values, and their names
    (the source embedding's first, where it is shared)."""
    untied = copy.deepcopy(model)
    weight = untied.decoder.embedding.weight
    uses = []
    if untied.encoder.embedding.weight is weight:
        uses.append("encoder.embedding.weight")
        untied.decoder.embedding.weight = nn.Parameter(weight.detach().clone())
    uses.append("decoder.embedding.weight")
    for name, module in untied.decoder.named_modules():
        if isinstance(module, TiedOutput):
            module.output.weight = nn.Parameter(weight.detach().clone())
            uses.append(f"decoder.{name}.output.weight")
    return untied, uses


def loss_and_gradients(model, forward) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    logits, _ = forward(model)
    loss = logits.log_softmax(-1).sin().sum()  # every logit its own gradient
    loss.backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters(remove_duplicate=False)
                             if p.grad is not None}  # (the encoder's bridge, unread by a Transformer decoder: none)


@pytest.mark.parametrize("path", ["teacher-forced", "stepped"])
@pytest.mark.parametrize("sharing", [False, True], ids=["tied", "tied-and-shared"])
@pytest.mark.parametrize("case, embedding_dim", CASES)
def test_the_tied_gradient_is_the_sum_of_the_untied_gradients(case, embedding_dim, sharing, path):
    src, lengths, tgt_in = padded_batch(src_vocab=V, tgt_vocab=V)
    model = built(case, embedding_dim, tie_output=True, share_embeddings=sharing)
    untied, uses = untied_copy(model)
    assert len(uses) == 2 + sharing and untied.num_parameters() > model.num_parameters()

    def forward(m):
        return m(src, lengths, tgt_in) if path == "teacher-forced" else step_by_step(m, src, lengths, tgt_in)

    logits, grads = loss_and_gradients(model, forward)
    untied_logits, untied_grads = loss_and_gradients(untied, forward)
    torch.testing.assert_close(logits, untied_logits)
    tied_grad = grads[uses[0]]
    assert all(torch.equal(grads[name], tied_grad) for name in uses)  # one tensor
    assert grads.keys() == untied_grads.keys()
    torch.testing.assert_close(tied_grad, sum(untied_grads[name] for name in uses))
    for name, grad in grads.items():  # every other parameter: the same gradient
        if name not in uses:
            torch.testing.assert_close(grad, untied_grads[name], msg=name)
    assert all(untied_grads[name].abs().sum() > 0 for name in uses)  # each use contributes


@pytest.mark.parametrize("case", ["bahdanau", "luong", "transformer"])
def test_a_saved_tied_model_loads_tied_with_the_same_outputs(tmp_path, case):
    model = built(case, 16, seed=3, tie_output=True, share_embeddings=True).float()
    with torch.no_grad():  # as after training: the padding row moves too (the output layer's gradient reaches it)
        model.decoder.embedding.weight.add_(0.1 * torch.randn_like(model.decoder.embedding.weight))
    path = tmp_path / "model.pt"
    torch.save({"model_config": asdict(model.config), "state_dict": model.state_dict()}, path)
    loaded = load_saved_model(path)
    [tied] = tied_outputs(loaded)
    assert loaded.encoder.embedding.weight is loaded.decoder.embedding.weight is tied.output.weight
    assert loaded.num_parameters() == model.num_parameters()
    src, lengths, tgt_in = padded_batch(src_vocab=V, tgt_vocab=V)
    torch.testing.assert_close(loaded(src, lengths, tgt_in)[0], model(src, lengths, tgt_in)[0])
    assert torch.equal(greedy_decode(loaded, src, lengths, max_length=6).tokens,
                       greedy_decode(model, src, lengths, max_length=6).tokens)


def test_sharing_two_vocabularies_of_different_sizes_is_refused():
    with pytest.raises(ConfigError, match="model.share_embeddings=true") as refused:
        build_seq2seq(ModelConfig(11, 13, share_embeddings=True))
    assert "model.share_embeddings=false" in refused.value.fix


@pytest.mark.parametrize("name", TASKS.names(generated=True))
def test_a_task_declares_one_vocabulary_exactly_when_its_sides_have_one(name):
    task = TASKS[name].model_validate({"task": name})
    assert TASKS[name].shares_vocabulary == (Vocabulary(task.source_tokens()) == Vocabulary(task.target_tokens()))


@pytest.mark.slow
def test_a_tied_and_shared_transformer_trains_and_comes_back_tied(tmp_path):
    """One run through train.py: encoder=transformer decoder=transformer with the three matrices tied
    (E = d: no projection); its logged parameter count, and the model MLflow holds rebuilt tied."""
    from attnseq.evaluation.trained_runs import load_trained_run
    from attnseq.tracking.client import TrackingClient

    overrides = [*tiny(max_epochs=1, heatmaps=False), "encoder=transformer", "decoder=transformer",
                 "model.embedding_dim=16", "model.tie_output=true", "model.share_embeddings=true",
                 "encoder.ff_dim=32", "decoder.ff_dim=32", "threads=1"]
    trained = train_once(tmp_path, *overrides)
    assert trained.proc.returncode == 0, explain(trained.proc)
    [run] = trained.runs
    assert run.data.params["model.tie_output"] == "True" and run.data.params["model.share_embeddings"] == "True"
    loaded = load_trained_run(TrackingClient(trained.uri), run).model
    [tied] = tied_outputs(loaded)
    assert loaded.encoder.embedding.weight is loaded.decoder.embedding.weight is tied.output.weight
    vocab, embedding = loaded.decoder.embedding.weight.shape
    untied = build_seq2seq(ModelConfig(**{**asdict(loaded.config), "tie_output": False, "share_embeddings": False}))
    assert int(run.data.params["model.num_parameters"]) == loaded.num_parameters()
    assert untied.num_parameters() - loaded.num_parameters() == 2 * vocab * embedding
