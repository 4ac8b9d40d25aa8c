"""The batched evaluation loop reports what the loop it replaced reported
(``benchmarks/evaluation_reference.py``), for greedy and beam decoding with the counterfactual
replays, on every decoder, one and two heads, and the model without attention: the same
predictions, heatmap samples, accuracies, diagnostics and flip rates, bit for bit. The total
variations, sums of float32 terms, are compared to 1e-6 of their value: a replay's scores can land
one float32 ulp apart when the same scorer call runs at another point of the process (seen on
luong-nofeed-additive with two heads: ``eval/cf_permute_tv`` 6e-8 apart, relatively), and the replays of a
decoder whose recurrence reads the attention run through the fused decoding step, whose logits lie within
float32 rounding of the stepped ones: a total variation of 2.5e-4 moved by 1.2e-9 (bahdanau-additive-h1), so
they also pass within 1e-7 absolute, the size of one float32 rounding of a probability. The swapped
weights' positions, hence the flips, are the same. The reference decodes through ``decoder.step``
(``stepwise``), evaluation through the fused decoding step: the same tokens, and the heatmap samples'
weights within 1e-6 (float rounding of the fused maths). Its teacher-forced pass runs as it did (the fused
recurrence), evaluation's through the fused decoding step where the recurrence reads the attention: weights
within float32 rounding, so the attention diagnostics, like the total variations, agree within 1e-6 of their
value (``eval/attn_mass_gold`` 0.17101079 against 0.17101081 on luong-feed-general-h2)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from attnseq.data import Seq2SeqDataModule, collate, encode_examples
from attnseq.evaluation.evaluator import EvalSettings, evaluate_run, evaluation_examples, length_limit
from attnseq.evaluation.trained_runs import TrainedRun
from attnseq.metrics import DIAGNOSTICS
from attnseq.model import ModelConfig, build_seq2seq, greedy_decode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from evaluation_reference import reference_evaluate_run  # noqa: E402  (benchmarks/ on sys.path)

DATASET = dict(task="copy", train_lengths=[1, 6], eval_lengths=[1, 12], bucket_width=4, train_size=32,
               val_size=8, test_size=8, batch_size=8, num_symbols=6)
SETTINGS = dict(lengths=(1, 12), bucket_width=4, size=60, batch_size=16, seed=3)  # 4 batches, the last one short

MODELS = {
    "bahdanau-additive-h1": dict(decoder="bahdanau", scorer="additive", heads=1),
    "bahdanau-additive-h2": dict(decoder="bahdanau", scorer="additive", heads=2),
    "luong-feed-general-h1": dict(decoder="luong", scorer="general", heads=1, input_feeding=True),
    "luong-feed-general-h2": dict(decoder="luong", scorer="general", heads=2, input_feeding=True),
    "luong-nofeed-dot-h1": dict(decoder="luong", scorer="dot", heads=1, input_feeding=False),
    "luong-nofeed-additive-h2": dict(decoder="luong", scorer="additive", heads=2, input_feeding=False),
    "no-attention": dict(scorer="none"),
}


def seeded_run(options: dict) -> TrainedRun:
    """An untrained model with seeded weights, wrapped as an evaluated run of the copy task."""
    data = Seq2SeqDataModule(**DATASET, seed=0)
    data.setup()
    config = ModelConfig(len(data.src_vocab), len(data.tgt_vocab), embedding_dim=8, hidden_size=16, **options)
    torch.manual_seed(7)
    model = build_seq2seq(config).eval()
    run_config = {"dataset": DATASET, "seed": 0, "decode": {"max_length_ratio": 1.5, "max_length_extra": 2}}
    return TrainedRun(None, run_config, data.src_vocab, data.tgt_vocab, model)


def is_total_variation(key: str) -> bool:
    return key.startswith(("eval/cf_", "cf_")) and key.endswith("_tv")


def read_from_weights(key: str) -> bool:
    """A total variation, or an attention diagnostic: numbers computed from float32 weights or logits."""
    return is_total_variation(key) or any(key.endswith(name) or f"/{name}" in key for name in DIAGNOSTICS)


def assert_same_numbers(new: dict, old: dict) -> None:
    assert list(new) == list(old)
    exact = {key: value for key, value in new.items() if not read_from_weights(key)}
    assert exact == {key: old[key] for key in exact}
    for key in set(new) - set(exact):
        assert new[key] == (None if old[key] is None else pytest.approx(old[key], rel=1e-6, abs=1e-7)), key


def same_samples(old, new) -> bool:
    return len(old) == len(new) and all(
        a_example == b_example
        and torch.equal(a.tokens, b.tokens)
        and torch.equal(a.lengths, b.lengths)
        and (a.attention is None and b.attention is None
             or torch.allclose(a.attention, b.attention, rtol=0.0, atol=1e-6))
        for (a_example, a), (b_example, b) in zip(old, new)
    )


@pytest.mark.parametrize("beam_size", [1, 5], ids=["greedy", "beam5"])
@pytest.mark.parametrize("name", MODELS)
def test_the_batched_loop_reports_exactly_what_the_reference_loop_did(name, beam_size):
    trained = seeded_run(MODELS[name])
    settings = EvalSettings(**SETTINGS, beam_size=beam_size, counterfactual=True)
    examples = evaluation_examples(trained, settings)
    old = reference_evaluate_run(trained, settings, examples)
    new = evaluate_run(trained, settings, examples)
    assert_same_numbers(new.metrics, old.metrics)
    assert len(new.bucket_rows) == len(old.bucket_rows)
    for new_row, old_row in zip(new.bucket_rows, old.bucket_rows):
        assert_same_numbers(new_row, old_row)
    assert new.predictions == old.predictions
    assert len(new.predictions) == len(examples) and all(new.predictions)
    assert same_samples(old.long_samples, new.long_samples)
    if name == "no-attention":
        assert not new.counterfactual and not any(key.startswith("eval/cf_") for key in new.metrics)
    else:  # the replays ran, and moved something: an untrained model reads its context
        assert new.metrics["eval/cf_permute_tv"] > 0 and new.metrics["eval/cf_uniform_tv"] > 0


def test_predictions_follow_the_order_of_the_examples():
    """The loop decodes length-sorted batches; ``predictions[i]`` is still example i's output."""
    trained = seeded_run(MODELS["bahdanau-additive-h1"])
    settings = EvalSettings(**SETTINGS, beam_size=1, counterfactual=False)
    examples = evaluation_examples(trained, settings)[:12]  # one batch
    assert [len(e.src) for e in examples] != sorted(len(e.src) for e in examples)  # the order matters here
    predictions = evaluate_run(trained, settings, examples).predictions
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].src))
    batch = collate(encode_examples([examples[i] for i in order], trained.src_vocab, trained.tgt_vocab))
    decoded = greedy_decode(trained.model, batch.src, batch.src_lengths, max_length=length_limit(trained, batch))
    for position, i in enumerate(order):
        n = int(decoded.lengths[position])
        assert predictions[i] == decoded.tokens[position, :n].tolist()


def test_the_benchmark_times_both_loops_and_renders_a_row_per_decoding():
    import evaluation_speed

    speed = evaluation_speed.measure(evaluation_speed.seeded_copy_run(), size=20, repeats=1, log=lambda line: None)
    for loop in ("reference", "batched"):
        assert set(speed.seconds[loop]) == set(evaluation_speed.BEAM_SIZES)
        assert all(0 < seconds < float("inf") for seconds in speed.seconds[loop].values())
    assert set(speed.decoding_s) == set(speed.stepwise_s) == set(evaluation_speed.BEAM_SIZES)
    for beam_size in evaluation_speed.BEAM_SIZES:  # times of a busy machine: positive, and the bound is their ratio
        assert 0 < speed.decoding_s[beam_size] < float("inf") and 0 < speed.stepwise_s[beam_size] < float("inf")
        assert speed.bound(beam_size) == speed.seconds["reference"][beam_size] / speed.decoding_s[beam_size]
        assert speed.decoding_ratio(beam_size) == speed.stepwise_s[beam_size] / speed.decoding_s[beam_size]
    table = evaluation_speed.render(speed)
    assert "| greedy |" in table and "| beam 5 |" in table and "20 sequences" in table


def test_the_teacher_forcing_benchmark_times_the_cases_whose_pass_changed():
    """``benchmarks/teacher_forcing_speed.py``: a row per cell × scorer × convention whose recurrence reads the
    attention (Bahdanau, Luong with input feeding), none for Luong without input feeding; four positive times each,
    and the speed-ups are their ratios."""
    import teacher_forcing_speed as module

    rows = module.measure(size=16, repeats=1, scorers=["additive", "general"], log=lambda line: None)
    feeding = [case for case in module.DECODERS if module.decoder_options(case).get("input_feeding", True)]
    assert sorted(row.case for row in rows) == sorted(
        f"{cell}/{scorer}/{case}" for cell in module.CELLS for scorer in ("additive", "general") for case in feeding
        if case != "transformer")
    for row in rows:
        assert all(0 < seconds < float("inf") for seconds in row.seconds.values())
        assert row.ratio("pass") == row.seconds["pass before"] / row.seconds["pass now"]
    # the additive score's hand-written recurrences move to the decoding step; Bahdanau's general-score loop stays
    moved = {row.case for row in rows if row.now == "decoding step"}
    assert moved == {row.case for row in rows if "additive" in row.case or row.case.endswith("general/luong")}
    for row in rows:  # one layer, a scorer called through its parts: never stepped before
        assert (row.before, row.now) == (("fused recurrence", "decoding step") if row.case in moved
                                         else ("rearranged loop", "rearranged loop")), row
    table = module.render(rows, 16, 1, threads=1)
    assert all(f"| {row.case} | {row.before} | {row.now} |" in table for row in rows)
    assert module.pass_speedups(rows) == [row.ratio("pass") for row in rows if row.case in moved]
