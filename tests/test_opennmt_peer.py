"""OpenNMT-py beside attnseq (benchmarks/opennmt_peer.py): the files OpenNMT-py is given hold the pairs attnseq
trains on, its configuration is the attnseq case it is set beside (read from attnseq's composed config), its
report lines are read into tokens per second over the window, attnseq trains and decodes through the real
command lines into a real store, and the tables' ratios and tests come from the measurements. OpenNMT-py itself
runs in its own environment (a second torch), in the benchmark only."""

from __future__ import annotations

import pytest
from benchmark_scripts import imported  # tests/ on sys.path
from scipy import stats


@pytest.fixture(scope="module")
def peer():
    """benchmarks/opennmt_peer.py imported as the script sees its siblings."""
    with imported("opennmt_peer") as module:
        yield module


@pytest.fixture(scope="module")
def composed(peer):
    """attnseq's composed config of a case with the benchmark's task (``cases.compose_case``: conf/ as train.py
    composes it)."""
    import cases  # the sibling the script imports; benchmarks/ is on sys.path while ``peer`` is

    return lambda case: cases.compose_case(case, peer.task_overrides(peer.FULL))


def test_the_files_opennmt_reads_hold_the_pairs_attnseq_trains_on(peer, tmp_path):
    """``steps`` batches of copy pairs: each target its source (the task, checked independently of the code that
    made it), every length in 5-40; the tokens per batch attnseq's rate counts are the files' (EOS included)."""
    sizes = peer.QUICK
    per_batch = peer.export(sizes, tmp_path)
    sources = (tmp_path / "train.src").read_text().splitlines()
    targets = (tmp_path / "train.tgt").read_text().splitlines()
    assert len(sources) == len(targets) == sizes.steps * peer.BATCH
    assert targets == sources
    assert all(5 <= len(line.split()) <= 40 for line in sources)
    assert per_batch == pytest.approx(sum(len(line.split()) + 1 for line in targets) / sizes.steps)
    tests = (tmp_path / "test.src").read_text().splitlines()
    assert len(tests) == sizes.decode_size and all(5 <= len(line.split()) <= 40 for line in tests)
    again = tmp_path / "again"
    peer.export(sizes, again)  # the seed decides the data: a second export is the same bytes
    assert (again / "train.src").read_bytes() == (tmp_path / "train.src").read_bytes()


@pytest.mark.parametrize("index", [0, 1])
def test_opennmt_trains_the_model_of_the_attnseq_case_beside_it(peer, composed, tmp_path, index):
    """Sizes, batch, rate, clipping and dropout from attnseq's own composed config for the pair's case; the score
    and input feeding from its scorer and decoder."""
    pair = peer.PAIRS[index]
    case = pair.cases[0]
    cfg = composed(case)
    onmt = peer.onmt_config(pair, tmp_path, tmp_path, peer.FULL)
    assert (onmt["word_vec_size"], onmt["hidden_size"], onmt["layers"]) == (
        cfg.model.embedding_dim, cfg.model.hidden_size, cfg.model.layers)
    assert (onmt["rnn_type"], cfg.encoder.cell, cfg.encoder.bidirectional) == ("GRU", "gru", False)
    assert (onmt["batch_size"], onmt["batch_type"]) == (cfg.dataset.batch_size, "sents")
    assert (onmt["learning_rate"], onmt["max_grad_norm"], onmt["dropout"]) == (
        cfg.optimizer.lr, cfg.trainer.gradient_clip_val, cfg.model.dropout)
    assert cfg.optimizer._target_ == "torch.optim.Adam" and onmt["optim"] == "adam"
    score = {"mlp": "additive", "general": "general"}[onmt["global_attention"]]
    assert cfg.scorer.name == score and cfg.decoder.convention == "luong"
    assert bool(onmt["input_feed"]) == (cfg.decoder.input_feeding is not False)
    assert onmt["train_steps"] * peer.BATCH == cfg.dataset.train_size and onmt["num_workers"] == 0


# OpenNMT-py 3.5.1's own lines (onmt_train on this benchmark's data, 400 steps), the first with its start-up
OPENNMT_LOG = """\
[2026-12-06 23:25:59,672 INFO] Starting training on CPU, could be very slow
[2026-12-06 23:26:15,685 INFO] Step 50/  400; acc: 10.4; ppl:  11.3; xent: 2.4; lr: 0.00100; sents:    3200; bsz: 1355/1419/64; 4232/4432 tok/s;     16 sec;
[2026-12-06 23:26:20,094 INFO] Step 100/  400; acc: 11.8; ppl:  10.4; xent: 2.3; lr: 0.00100; sents:    3200; bsz: 1405/1469/64; 15936/16662 tok/s;     20 sec;
[2026-12-06 23:26:24,031 INFO] Step 150/  400; acc: 14.0; ppl:  10.2; xent: 2.3; lr: 0.00100; sents:    3200; bsz: 1421/1485/64; 18055/18868 tok/s;     24 sec;
[2026-12-06 23:26:28,311 INFO] Step 200/  400; acc: 15.3; ppl:  10.3; xent: 2.3; lr: 0.00100; sents:    3200; bsz: 1456/1520/64; 17006/17753 tok/s;     29 sec;
"""  # noqa: E501  (verbatim)


def test_opennmts_reports_after_the_first_are_read_into_one_rate(peer):
    """Target tokens over seconds of steps 51-200: each window 50 batches of its mean target tokens, at its rate."""
    windows = [(1469 * 50, 16662), (1485 * 50, 18868), (1520 * 50, 17753)]
    expected = sum(tokens for tokens, _ in windows) / sum(tokens / rate for tokens, rate in windows)
    assert peer.onmt_rate(OPENNMT_LOG) == pytest.approx(expected)
    assert 16662 < peer.onmt_rate(OPENNMT_LOG) < 18868
    with pytest.raises(RuntimeError, match="no training report"):
        peer.onmt_rate(OPENNMT_LOG.splitlines()[1])  # the start-up window alone


def test_attnseq_trains_and_decodes_through_its_command_lines(peer, tmp_path):
    """QUICK's 100 batches through ``train.py`` into a real store, the rate over its logged window; then
    ``translate.py`` on the test sources: one output line per source, the mean output length read off them."""
    sizes = peer.Sizes(steps=peer.QUICK.steps, decode_size=16, repeats=1)
    data = tmp_path / "data"
    per_batch = peer.export(sizes, data)
    case = peer.PAIRS[1].cases[0]
    rate, run_id = peer.train_attnseq(case, tmp_path / "run", sizes, threads=1, tokens_per_batch=per_batch)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'run'}/mlflow.db")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["scorer.name"] == "general"
    losses = sorted(client.get_metric_history(run_id, "train/loss_step"), key=lambda m: m.step)
    assert [m.step for m in losses] == [peer.REPORT_EVERY - 1, 2 * peer.REPORT_EVERY - 1]  # Lightning's step index
    window_s = (losses[-1].timestamp - losses[0].timestamp) / 1000
    assert rate == pytest.approx(per_batch * peer.REPORT_EVERY / window_s)
    run_s = (run.info.end_time - run.info.start_time) / 1000
    assert rate > per_batch * sizes.steps / run_s  # the window leaves out start-up and the end's uploads
    decoding = peer.decode_attnseq(run_id, tmp_path / "run", data, beam=2, threads=1)
    outputs = (tmp_path / "run" / "translate-beam2.log").read_text().splitlines()
    assert len(outputs) == sizes.decode_size and 0 < decoding.own_s < decoding.wall_s
    assert decoding.output_words == pytest.approx(sum(len(line.split()) for line in outputs) / len(outputs))


def test_the_tables_give_each_case_its_median_ratio_and_welch_p(peer):
    Result, Decoding = peer.Result, peer.Decoding
    additive, general = peer.PAIRS
    results = {
        peer.onmt_label(additive): Result([10_000.0, 12_000.0], {1: [Decoding(8.0, 2.0, 30.0),
                                                                   Decoding(10.0, 2.4, 30.0)]}),
        f"attnseq {additive.cases[0].name}": Result([30_000.0, 34_000.0], {1: [Decoding(4.0, 1.0, 29.0),
                                                                               Decoding(6.0, 1.2, 31.0)]}),
        f"attnseq {additive.cases[1].name}": Result([20_000.0, 24_000.0], {1: []}),
        peer.onmt_label(general): Result([40_000.0, 44_000.0], {1: [Decoding(6.0, 1.0, 20.0)] * 2}),
        f"attnseq {general.cases[0].name}": Result([50_000.0, 54_000.0], {1: [Decoding(3.0, 0.5, 20.0)] * 2}),
    }
    sizes = peer.Sizes(steps=400, decode_size=2000, repeats=2, beams=(1,))
    table = peer.render(results, sizes, threads=2, command="cmd")
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): [cell.strip() for cell in line.split("|")[3:-1]]
            for line in table.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows[(additive.name, f"`{additive.cases[0].name}`")][:3] == ["11,000", "32,000", "**2.91×**"]
    assert rows[(additive.name, f"`{additive.cases[1].name}`")][2] == "**2.00×**"
    t = stats.ttest_ind([30_000.0, 34_000.0], [10_000.0, 12_000.0], equal_var=False)
    assert float(rows[(additive.name, f"`{additive.cases[0].name}`")][3]) == pytest.approx(t.pvalue, abs=1e-3)
    # Welch's t of [50k, 54k] against [40k, 44k]: difference 10k over √(8e6/2 + 8e6/2), 2 degrees of freedom
    p = 2 * stats.t.sf(10_000 / (8e6) ** 0.5, df=2)
    ratio, shown_p, goal = rows[(general.name, f"`{general.cases[0].name}`")][2:]
    assert (ratio, shown_p) == ("**1.24×**", f"{p:.3f}") and "1.5" in goal and "NOT met" in goal
    assert rows[(additive.name, f"`{additive.cases[0].name}`")][4] == ""  # no goal for this pair
    decoding = rows[(f"{additive.name} / `{additive.cases[0].name}`", "greedy")]
    # the translation alone: medians 2.2 s against 1.1 s; launch to exit 9 s against 5 s
    assert decoding[:2] == ["2.2 / 1.1", "**2.00×**"] and decoding[3:] == ["9.0 / 5.0", "1.80×", "30.0 / 30.0"]
    t = stats.ttest_ind([1.0, 1.2], [2.0, 2.4], equal_var=False)
    assert float(decoding[2]) == pytest.approx(t.pvalue, abs=1e-3)
    lines = peer.targets(results, sizes)
    [goal_line] = [line for line in lines if "1.5" in line]  # the one goal: the general pair's own case
    assert general.cases[0].name in goal_line and "**1.24×**" in goal_line and "NOT met" in goal_line
    assert sum("met" not in line for line in lines) == 2 + 2  # the other training rows and each decoding: measured
