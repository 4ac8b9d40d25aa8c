"""What a training step optimises and at what rate: label smoothing (``training.label_smoothing``)
against a smoothed cross-entropy written out by hand, the Noam and inverse-sqrt schedules
(``lr_schedule=noam``, ``lr_schedule=inverse_sqrt``) against their formulas, and gradient
accumulation (``trainer.accumulate_grad_batches``) through a real ``lightning.Trainer`` with every
fast path the model can take: the same gradient as one batch of both halves. One run through the
real ``train.py`` checks the keys reach training and the logged ``train/lr`` rises then falls."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from attnseq.data.batch import Batch, collate
from attnseq.data.example import EncodedExample
from attnseq.data.vocab import PAD
from attnseq.kernels import FastPaths
from attnseq.model import ModelConfig, build_seq2seq
from attnseq.training.lit_module import Seq2SeqLitModule, token_cross_entropy
from attnseq.training.optimizers import OptimizerFactory
from attnseq.training.schedules import InverseSqrt, Noam

V_SRC, V_TGT = 11, 9


# -- label smoothing ------------------------------------------------------------------------------
def smoothed_cross_entropy_by_hand(logits: torch.Tensor, target: torch.Tensor, epsilon: float) -> torch.Tensor:
    """One token at a time: q = (1 − ε) · one-hot(gold) + ε / V (torch's definition), loss −Σ_v q_v log p_v,
    the mean over the tokens whose target is not PAD."""
    vocab = logits.shape[-1]
    total, count = logits.new_zeros(()), 0
    for b in range(target.shape[0]):
        for t in range(target.shape[1]):
            gold = int(target[b, t])
            if gold == PAD:
                continue
            log_p = logits[b, t] - torch.logsumexp(logits[b, t], dim=0)  # (V,)
            q = [(1 - epsilon) * (v == gold) + epsilon / vocab for v in range(vocab)]
            total = total - sum(q[v] * log_p[v] for v in range(vocab))
            count += 1
    return total / count


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.45])
def test_the_smoothed_loss_equals_a_hand_written_smoothed_cross_entropy_padding_excluded(epsilon):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 4, V_TGT, generator=gen, dtype=torch.float64, requires_grad=True)  # (B, T, V)
    target = torch.tensor([[4, 5, 2, 0], [3, 2, 0, 0], [6, 7, 8, 2]])  # (B, T): PAD = 0 at the ends
    loss = token_cross_entropy(logits, target, epsilon)
    expected = smoothed_cross_entropy_by_hand(logits, target, epsilon)
    torch.testing.assert_close(loss, expected)
    if epsilon == 0.0:  # today's loss, exactly
        plain = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD)
        assert torch.equal(loss, plain)
    (grad,) = torch.autograd.grad(loss, logits)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    torch.testing.assert_close(grad, expected_grad)
    real = target != PAD  # (B, T)
    assert torch.all(grad[~real] == 0)  # a padded position teaches nothing
    # the gradient per real token is (softmax − q) / tokens: q's mass ε/V on every class, 1 − ε on the gold
    q = torch.full_like(logits, epsilon / V_TGT).scatter_add(
        -1, target.unsqueeze(-1), torch.full(target.shape + (1,), 1 - epsilon, dtype=logits.dtype))
    torch.testing.assert_close(grad[real], ((logits.softmax(-1) - q) / real.sum())[real].detach())


def test_validation_reports_the_plain_cross_entropy_under_label_smoothing():
    """``val/loss`` stays the NLL of the gold token (comparable across runs of any ε); the training
    step's loss is the smoothed one."""
    module = lit_module(model(), label_smoothing=0.3)
    batch = make_batch([(3, 2), (5, 4), (1, 3)])
    metrics = module.metric_suite("val")
    with torch.no_grad():
        module._evaluate(batch, metrics)
        logits, _ = module.model(batch.src, batch.src_lengths, batch.tgt_in)  # (B, T, V), teacher forced
    assert metrics.compute()["val/loss"].item() == pytest.approx(
        smoothed_cross_entropy_by_hand(logits, batch.tgt_out, 0.0).item(), rel=1e-6)
    assert module.loss(logits, batch.tgt_out, module.label_smoothing).item() == pytest.approx(
        smoothed_cross_entropy_by_hand(logits, batch.tgt_out, 0.3).item(), rel=1e-6)


# -- learning-rate schedules ------------------------------------------------------------------------
def rates(scheduler_class, steps: int, lrs=(0.5,), **settings) -> list[list[float]]:
    """Each parameter group's rate at optimizer steps 1..``steps``, read before each step."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
    optimizer = torch.optim.SGD(groups)
    scheduler = scheduler_class(optimizer, **settings)
    seen = []
    for _ in range(steps):
        seen.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return seen


def test_noam_is_vaswanis_formula_at_every_optimizer_step():
    """lr(k) = factor · d^-0.5 · min(k^-0.5, k · warmup^-1.5) (Vaswani et al. 2017, eq. 3), from k = 1;
    the optimizer's own lr is not read."""
    warmup, d, factor = 8, 64, 2.0
    got = [group[0] for group in rates(Noam, 40, lrs=(123.0,), warmup=warmup, model_size=d, factor=factor)]
    expected = [factor / math.sqrt(d) * min(1 / math.sqrt(k), k / warmup**1.5) for k in range(1, 41)]
    assert got == pytest.approx(expected, rel=1e-12)
    assert max(range(40), key=got.__getitem__) + 1 == warmup  # the peak, factor · (d · warmup)^-0.5
    assert got[warmup - 1] == pytest.approx(factor / math.sqrt(d * warmup))
    assert all(a < b for a, b in zip(got[:warmup], got[1:warmup])) and all(
        a > b for a, b in zip(got[warmup - 1:], got[warmup:]))


def test_inverse_sqrt_warms_up_linearly_to_each_groups_lr_then_falls_as_one_over_root_k():
    warmup = 5
    got = rates(InverseSqrt, 30, lrs=(0.01, 0.003), warmup=warmup)
    for group, peak in enumerate((0.01, 0.003)):
        expected = [peak * (k / warmup if k < warmup else math.sqrt(warmup / k)) for k in range(1, 31)]
        assert [row[group] for row in got] == pytest.approx(expected, rel=1e-12)


def test_a_resumed_schedule_continues_the_curve():
    """Its state is the step count (in the checkpoint): a scheduler restored after 7 steps gives step 8's rate."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    first = Noam(optimizer, warmup=4, model_size=16)
    for _ in range(7):
        optimizer.step()
        first.step()
    state = first.state_dict()
    again = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    resumed = Noam(again, warmup=4, model_size=16)
    resumed.load_state_dict(state)
    resumed.step()  # Lightning steps after each optimizer step; the rate is then step 9's on both
    first.step()
    assert again.param_groups[0]["lr"] == pytest.approx(optimizer.param_groups[0]["lr"])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(16**-0.5 * 9**-0.5)


# -- gradient accumulation with every fast path -------------------------------------------------------
def make_batch(pairs: list[tuple[int, int]], seed: int = 0) -> Batch:
    """A collated batch of (source length, target length) pairs, ids drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return collate([EncodedExample(torch.randint(4, V_SRC, (s,), generator=gen).tolist(),
                                   torch.randint(4, V_TGT, (t,), generator=gen).tolist()) for s, t in pairs])


def joined(batches: list[Batch]) -> Batch:
    """One batch of every example of ``batches``, padded to the longest."""
    return collate([EncodedExample(b.src[i, : b.src_lengths[i]].tolist(), b.tgt_out[i, : b.tgt_lengths[i] - 1].tolist())
                    for b in batches for i in range(len(b))])  # tgt_out less its EOS: the target tokens


HALVES = ([(6, 4), (2, 1)], [(3, 2), (5, 3)])
"""Two half-batches of different source and target lengths (so each is padded differently from the
whole) holding the same number of real target tokens (4 + 1 + 2 EOS = 2 + 3 + 2 EOS = 7)."""

FAST_PATHS = {
    # case: (model settings, the fast paths the model is built with, the kernels its training step must run)
    "bahdanau-additive-gru (fused additive recurrence, GRU sequence kernel)":
        (dict(), FastPaths(), {"AdditiveGRURecurrence", "GRUSequence"}),
    "bahdanau-additive-lstm (fused additive LSTM recurrence, LSTM sequence kernel)":
        (dict(cell="lstm"), FastPaths(lstm_sequence=True), {"AdditiveLSTMRecurrence", "LSTMSequence"}),
    "bahdanau-general-bigru-h2 (fused decoder loop)":
        (dict(scorer="general", heads=2, bidirectional=True), FastPaths(), {"bahdanau", "GRUSequence"}),
    "luong-feed-additive (fused Luong recurrence)":
        (dict(decoder="luong", input_feeding=True), FastPaths(), {"AdditiveLuongRecurrence"}),
    "luong-feed-multihead-h2 (fused Luong loop)":
        (dict(decoder="luong", input_feeding=True, scorer="multihead", heads=2), FastPaths(),
         {"luong_input_feeding"}),
    "luong-nofeed-concat (all steps at once: GRU sequence, additive scores)":
        (dict(decoder="luong", input_feeding=False, scorer="concat"), FastPaths(), {"GRUSequence", "AdditiveScores"}),
    "luong-nofeed-additive-lstm (all steps at once: LSTM sequence, additive scores)":
        (dict(decoder="luong", input_feeding=False, cell="lstm"), FastPaths(lstm_sequence=True),
         {"LSTMSequence", "AdditiveScores"}),
    "luong-nofeed-dot-local-monotonic (all steps through the window)":
        (dict(decoder="luong", input_feeding=False, scorer="dot", local="monotonic", window=2), FastPaths(),
         {"GRUSequence"}),
    "none (the plain decoder: the whole target in one RNN call)":
        (dict(scorer="none"), FastPaths(), {"GRUSequence"}),
    "transformer-transformer (one causal pass)":
        (dict(encoder="transformer", decoder="transformer", scorer="multihead", heads=2,
              encoder_options=dict(layers=1, heads=2, ff_dim=16),
              decoder_options=dict(layers=2, heads=2, ff_dim=16, shown_layer=None)), FastPaths(), {"teacher_forced"}),
    "every fast path off (step by step, autograd's GRU)":
        (dict(), FastPaths(fused_decoder=False, gru_sequence=False, lstm_sequence=False, additive_all_steps=False),
         set()),
}


def model(fast_paths: FastPaths | None = None, **settings) -> torch.nn.Module:
    torch.manual_seed(0)
    config = ModelConfig(V_SRC, V_TGT, embedding_dim=6, hidden_size=8, **settings)
    return build_seq2seq(config, fast_paths or FastPaths()).double()


def lit_module(seq2seq, label_smoothing: float = 0.0) -> Seq2SeqLitModule:
    return Seq2SeqLitModule(seq2seq, OptimizerFactory(torch.optim.SGD, {"lr": 0.1}), train_lengths=(1, 6),
                            max_eval_length=12, bucket_width=5, label_smoothing=label_smoothing)


def kernels_called(monkeypatch, seq2seq) -> list[str]:
    """The fast paths' entry points a forward and backward pass goes through, by name, as they run."""
    from attnseq.kernels import additive_recurrence, additive_scores, gru_sequence, lstm_sequence, luong_recurrence
    from attnseq.model import fused_decoders

    calls: list[str] = []

    def spy(owner, name, label=None):
        original = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, **k: calls.append(label or name) or original(*a, **k))

    for function in (additive_recurrence.AdditiveGRURecurrence, additive_recurrence.AdditiveLSTMRecurrence,
                     luong_recurrence.AdditiveLuongRecurrence, additive_scores.AdditiveScores,
                     gru_sequence.GRUSequence, lstm_sequence.LSTMSequence):
        spy(function, "apply", function.__name__)
    for loop in ("bahdanau", "luong_input_feeding"):
        spy(fused_decoders, loop)
    if seq2seq.decoder.takes_fast_path():
        spy(seq2seq.decoder, "teacher_forced")
    return calls


class GradientsAtTheStep(L.Callback):
    """Every parameter's gradient when the optimizer steps (after accumulation, before clipping)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.steps.append({n: p.grad.clone() for n, p in pl_module.model.named_parameters() if p.grad is not None})


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
@pytest.mark.parametrize("case", FAST_PATHS)
def test_two_accumulated_half_batches_give_the_gradient_of_the_whole_batch(case, monkeypatch):
    """``trainer.accumulate_grad_batches=2`` in a real Trainer, label smoothing on: Lightning divides
    each half's loss (a per-token mean) by 2 and adds the gradients, so the step's gradient is the mean
    of the halves' per-token means; with as many real target tokens in each half that is exactly the
    per-token mean over the whole batch, whose gradient is computed here in one pass (each half padded
    to its own lengths, the whole to the longest). Unequal halves would weight a token by 1 / (2 · its
    half's tokens) instead of 1 / all tokens: the test checks that too, from the halves' own gradients."""
    settings, fast_paths, expected_kernels = FAST_PATHS[case]
    seq2seq = model(fast_paths, **settings)
    module = lit_module(seq2seq, label_smoothing=0.1)
    halves = [make_batch(pairs, seed=i) for i, pairs in enumerate(HALVES)]
    whole = joined(halves)
    tokens = [int(b.tgt_lengths.sum()) for b in halves]
    assert tokens[0] == tokens[1] and whole.tgt_out.shape[1] > min(b.tgt_out.shape[1] for b in halves)

    def gradient(batch: Batch) -> dict[str, torch.Tensor]:
        seq2seq.zero_grad()
        logits, _ = seq2seq(batch.src, batch.src_lengths, batch.tgt_in)  # (B, T, V)
        smoothed_cross_entropy_by_hand(logits, batch.tgt_out, 0.1).backward()
        return {n: p.grad.clone() for n, p in seq2seq.named_parameters() if p.grad is not None}

    reference = gradient(whole)  # before the spies: only the Trainer's run is watched
    calls = kernels_called(monkeypatch, seq2seq)
    seen = GradientsAtTheStep()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, accumulate_grad_batches=2, logger=False,
                        callbacks=[seen], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(module, train_dataloaders=DataLoader(halves, batch_size=None))  # one Batch at a time, in order
    assert expected_kernels <= set(calls), (case, sorted(set(calls)))
    (accumulated,) = seen.steps
    assert accumulated.keys() == reference.keys()
    for name, grad in accumulated.items():
        torch.testing.assert_close(grad, reference[name], msg=name)

    # unequal halves: the sum of each half's gradient × its tokens / all tokens is the whole batch's gradient
    module.model.load_state_dict(lit_module(model(fast_paths, **settings)).model.state_dict())  # the step moved it
    uneven = [make_batch(pairs, seed=i) for i, pairs in enumerate(([(6, 4), (2, 1), (3, 2)], [(5, 3)]))]
    counts = [int(b.tgt_lengths.sum()) for b in uneven]
    parts = [gradient(b) for b in uneven]
    for name, grad in gradient(joined(uneven)).items():
        weighted = sum(part[name] * count for part, count in zip(parts, counts, strict=True)) / sum(counts)
        torch.testing.assert_close(weighted, grad, msg=name)


# -- through the real CLI ------------------------------------------------------------------------------
def one_accumulated_epoch(tmp_path, *overrides: str):
    """The real train.py: one tiny epoch of 16 batches of 8, 2 per optimizer step, a schedule warmup of 3
    steps, every step logged; the finished training and its one run."""
    from cli_helpers import explain, tiny
    from conftest import train_once

    trained = train_once(tmp_path, *tiny(max_epochs=1, heatmaps=False), "dataset.batch_size=8", "scheduler.warmup=3",
                         "trainer.accumulate_grad_batches=2", "trainer.log_every_n_steps=1", *overrides)
    assert trained.proc.returncode == 0, explain(trained.proc)
    (run,) = trained.runs
    return trained, run


def rates_by_optimizer_step(trained, run) -> list[float]:
    """The run's ``train/lr``, one rate per optimizer step in step order (both accumulated halves of a
    step log the same rate)."""
    history = trained.client.get_metric_history(run.info.run_id, "train/lr")
    by_step = {m.step: m.value for m in sorted(history, key=lambda m: (m.step, m.timestamp))}
    assert len({(m.step, m.value) for m in history}) == len(by_step)
    return [by_step[step] for step in sorted(by_step)]


@pytest.mark.slow
def test_train_py_smooths_the_loss_and_logs_a_noam_rate_that_rises_then_falls(tmp_path):
    """One tiny epoch of 16 batches, 2 per optimizer step, Noam with a warmup of 3 steps, ε = 0.1: the
    run records the keys, and ``train/lr`` (logged at every step) is Vaswani's rate of each of the 8
    optimizer steps (d = model.hidden_size = 16), rising to step 3 and falling after."""
    trained, run = one_accumulated_epoch(tmp_path, "lr_schedule=noam", "training.label_smoothing=0.1")
    params = run.data.params
    assert params["training.label_smoothing"] == "0.1" and params["scheduler._target_"].endswith("schedules.Noam")
    assert params["scheduler.model_size"] == "16" and params["trainer.accumulate_grad_batches"] == "2"
    rates = rates_by_optimizer_step(trained, run)
    assert rates == pytest.approx([16**-0.5 * min(k**-0.5, k * 3**-1.5) for k in range(1, 9)])
    peak = rates.index(max(rates))
    assert peak == 2 and rates[:peak + 1] == sorted(rates[:peak + 1]) and rates[peak:] == sorted(rates[peak:])[::-1]
    assert all(math.isfinite(m.value) for m in trained.client.get_metric_history(run.info.run_id, "train/loss"))


@pytest.mark.slow
def test_train_py_logs_an_inverse_sqrt_rate_that_warms_up_to_optimizer_lr_then_falls(tmp_path):
    """``lr_schedule=inverse_sqrt`` through the real CLI: one tiny epoch of 16 batches, 2 per optimizer
    step, a warmup of 3 steps; ``train/lr`` at each of the 8 optimizer steps is optimizer.lr · k/3 up to
    the peak at step 3 (optimizer.lr itself), then optimizer.lr · √(3/k)."""
    trained, run = one_accumulated_epoch(tmp_path, "optimizer.lr=0.01", "lr_schedule=inverse_sqrt")
    params = run.data.params
    assert params["scheduler._target_"].endswith("schedules.InverseSqrt") and params["scheduler.warmup"] == "3"
    assert params["scheduler.interval"] == "step" and params["trainer.accumulate_grad_batches"] == "2"
    rates = rates_by_optimizer_step(trained, run)
    assert rates == pytest.approx([0.01 * min(k / 3, math.sqrt(3 / k)) for k in range(1, 9)])
    assert rates.index(max(rates)) == 2 and max(rates) == pytest.approx(0.01)
