"""JoeyNMT's own task end to end (benchmarks/joeynmt_reverse.py): the data JoeyNMT is given is the data
attnseq trains on, JoeyNMT's log is read into validations as its tutorial prints them, attnseq validates
at JoeyNMT's cadence (counted in optimizer updates) and decodes the test split through the real CLIs, and
the tables' ratios come from the runs. JoeyNMT itself runs in its own environment (a second torch, 1.6 GB),
in the benchmark only: where a test needs its process, a stand-in prints JoeyNMT's own lines."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest
from benchmark_scripts import imported  # tests/ on sys.path
from scipy import stats


@pytest.fixture(scope="module")
def joey():
    """benchmarks/joeynmt_reverse.py imported as the script sees its siblings (its folder first on sys.path)."""
    with imported("joeynmt_reverse") as module:
        yield module


def test_the_files_joeynmt_reads_hold_the_pairs_attnseq_trains_on(joey, tmp_path):
    """Each split written as JoeyNMT's ``<stem>.src|trg``: as many lines as the split has pairs, each target
    the reversed source (the task, checked independently of the code that made it), every length in range."""
    counts = joey.export(0, joey.QUICK, tmp_path)
    assert counts == {"train": 600, "val": 40, "test": 40}
    for split, stem in joey.SPLITS.items():
        sources = (tmp_path / f"{stem}.src").read_text(encoding="utf-8").splitlines()
        targets = (tmp_path / f"{stem}.trg").read_text(encoding="utf-8").splitlines()
        assert len(sources) == len(targets) == counts[split]
        for source, target in zip(sources, targets, strict=True):
            assert target.split() == source.split()[::-1]
        longest = 25 if split == "train" else 30  # conf/experiment/joey_reverse.yaml's lengths
        assert all(1 <= len(source.split()) <= longest for source in sources)
    again = tmp_path / "again"
    joey.export(0, joey.QUICK, again)  # the seed decides the data: a second export is the same bytes
    assert (again / "train.src").read_bytes() == (tmp_path / "train.src").read_bytes()


# JoeyNMT 2.3.0's own lines (its tutorial, docs/source/tutorial.rst), around a validation and at the end
TUTORIAL_LOG = """\
2024-01-15 12:57:12,987 - INFO - joeynmt.training - Epoch   1, Step:      900, Batch Loss:    21.149554, Batch Acc: 0.390395, Tokens per Sec:     9462, Lr: 0.001000
2024-01-15 12:57:16,549 - INFO - joeynmt.training - Epoch   1, Step:     1000, Batch Loss:    35.254892, Batch Acc: 0.414826, Tokens per Sec:     9317, Lr: 0.001000
2024-01-15 12:57:16,550 - INFO - joeynmt.prediction - Predicting 1000 example(s)... (Greedy decoding with min_output_length=1, max_output_length=30, return_prob='none', generate_unk=True, repetition_penalty=-1, no_repeat_ngram_size=-1)
2024-01-15 12:57:29,506 - INFO - joeynmt.prediction - Generation took 12.9554[sec].
2024-01-15 12:57:29,549 - INFO - joeynmt.prediction - Evaluation result (greedy): bleu:  22.52, loss:  29.77, ppl:   5.88, acc:   0.50, 0.0398[sec]
2024-01-15 12:57:29,549 - INFO - joeynmt.training - Hooray! New best validation result [bleu]!
2024-01-15 12:57:29,580 - INFO - joeynmt.training - Checkpoint saved in models/reverse_experiment/1000.ckpt.
2024-01-15 13:02:11,001 - INFO - joeynmt.training - Epoch   5, Step:     7000, Batch Loss:     1.25, Batch Acc: 0.99, Tokens per Sec:     9317, Lr: 0.001000
2024-01-15 13:02:12,001 - INFO - joeynmt.prediction - Evaluation result (greedy): bleu:  95.42, loss:   0.77, ppl:   1.08, acc:   0.98, 0.0398[sec]
2024-01-15 13:02:15,429 - INFO - joeynmt.training - Training ended after   5 epochs.
2024-01-15 13:25:32,725 - INFO - joeynmt.prediction - Evaluation result (greedy): bleu:  95.19, 0.1821[sec]
"""  # noqa: E501  (verbatim)


def test_joeynmts_log_is_read_into_its_validations_until_training_ends(joey):
    reader = joey.JoeyLog()
    found = [v for i, line in enumerate(TUTORIAL_LOG.splitlines()) if (v := reader.read(line, float(i))) is not None]
    assert found == [(4.0, 1000, 22.52), (8.0, 7000, 95.42)]  # the test split's score after the end is not one
    assert reader.checkpoint == "models/reverse_experiment/1000.ckpt"


def test_after_the_target_validation_the_run_waits_for_its_checkpoint_then_stops(joey, tmp_path):
    """A stand-in for ``python -m joeynmt train`` prints a validation under the target, one at it, then (a second
    later) that validation's checkpoint, then would train on for a minute: the run holds both validations, stops
    once the checkpoint is saved (not before: the decodings load it), and decodes with that checkpoint."""
    lines = [TUTORIAL_LOG.splitlines()[i] for i in (1, 4)]  # step 1000, then its validation at BLEU 22.52
    lines += ["2024-01-15 12:58:29,506 - INFO - joeynmt.training - Epoch   1, Step:     2000, Batch Loss: 1.0",
              "2024-01-15 12:58:29,549 - INFO - joeynmt.prediction - Evaluation result (greedy): bleu:  95.50, "
              "loss:   0.77, ppl:   1.08, acc:   0.98, 0.0398[sec]"]
    fake = tmp_path / "joeynmt-python"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys, time
        for line in {lines!r}:
            print(line, flush=True)
        time.sleep(1.0)
        print("2024-01-15 12:58:30,600 - INFO - joeynmt.training - Checkpoint saved in /models/2000.ckpt.", flush=True)
        time.sleep(60)
        print("2024-01-15 12:59:30,000 - INFO - joeynmt.training - Epoch   1, Step:     2100, Batch Loss: 1.0")
        """))
    fake.chmod(0o755)
    started = time.monotonic()
    run = joey.run_joeynmt(fake, tmp_path / "data", tmp_path / "run", seed=0, sizes=joey.FULL, threads=1,
                           stop_at=95.0, budget_s=600)
    assert [(step, bleu) for _, step, bleu in run.validations] == [(1000, 22.52), (2000, 95.5)]
    assert run.model == "/models/2000.ckpt"
    assert 1.0 <= run.wall_s < 30 and time.monotonic() - started < 30  # stopped after the save, not at the end
    assert "Checkpoint saved in /models/2000.ckpt" in (tmp_path / "run" / "train.log").read_text()


def test_joeynmt_decodes_with_the_training_configuration_its_checkpoint_and_the_shared_search(joey, tmp_path):
    """The decoding configuration is the training's with the checkpoint, the beam, no length penalty and
    translate.py's batch cap; a stand-in for ``python -m joeynmt translate`` that reverses its standard input,
    as a trained model would, and logs JoeyNMT's "Generation took" line on its standard error: its outputs are
    read off its standard output and its own time off that line."""
    data = tmp_path / "data"
    joey.export(0, joey.QUICK, data)
    training = joey.joeynmt_config(data, tmp_path / "model", 0, joey.QUICK)
    decoding = joey.decoding_config(training, "/models/2000.ckpt", 5)
    assert decoding["testing"] == {**training["testing"], "load_model": "/models/2000.ckpt", "beam_size": 5,
                                   "beam_alpha": 0.0, "batch_size": 256, "batch_type": "sentence"}
    assert {key: value for key, value in decoding.items() if key != "testing"} == {
        key: value for key, value in training.items() if key != "testing"}
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.yaml").write_text(joey.yaml.safe_dump(training))
    fake = tmp_path / "joeynmt-python"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        assert sys.argv[1:4] == ["-m", "joeynmt", "translate"], sys.argv
        for line in sys.stdin:
            print(" ".join(line.split()[::-1]))
        print("2026-12-07 01:52:21,502 - INFO - joeynmt.prediction - Generation took 0.4321[sec].", file=sys.stderr)
        """))
    fake.chmod(0o755)
    decoded = joey.decode_joeynmt(fake, "/models/2000.ckpt", data, workdir, beam=5, threads=1)
    written = joey.yaml.safe_load((workdir / "translate-beam5.yaml").read_text())
    assert written == decoding
    assert decoded.own_s == 0.4321 and decoded.wall_s > 0
    sources = (data / "test.src").read_text().splitlines()
    assert decoded.output_words == pytest.approx(sum(len(s.split()) for s in sources) / len(sources))
    assert joey.test_bleu(workdir / "joeynmt-beam5.txt", data) == pytest.approx(100.0)  # the reversal is the task


def test_attnseq_validates_at_joeynmts_cadence_in_updates_through_the_cli(joey, tmp_path):
    """The quick corpus (600 pairs: about 26 updates of 2 batches of 12 an epoch) for two epochs, validated
    every 15 updates = 30 batches: attnseq's validations fall at 15, 30, 45 updates, counted over the run as
    JoeyNMT counts them (counted within each epoch they would fall at 15, then 15 updates into the second
    epoch), read back from its store with their launch-relative seconds."""
    sizes = joey.Sizes(joey.QUICK.overrides, epochs=2, validate_every=15, logging_every=5)
    run = joey.run_attnseq(0, sizes, threads=1, stop_at=101.0, budget_s=600, workdir=tmp_path / "run")
    assert [step for _, step, _ in run.validations] == [15, 30, 45]
    seconds = [s for s, _, _ in run.validations]
    assert 0 < seconds[0] and seconds == sorted(seconds) and seconds[-1] < run.wall_s
    assert all(0 <= bleu <= 100 for _, _, bleu in run.validations)
    # the run's model translates the test split through translate.py, greedy and beam 2
    data = tmp_path / "data"
    joey.export(0, joey.QUICK, data)
    joey.decode(run, None, data, tmp_path / "run", threads=1, beams=(1, 2))
    assert sorted(run.decodings) == [1, 2]
    for beam, decoded in run.decodings.items():
        assert 0 < decoded.own_s < decoded.wall_s  # the translation alone within the launch
        outputs = (tmp_path / "run" / f"translate-beam{beam}.log").read_text().splitlines()
        assert len(outputs) == 40  # a line per test source (test_bleu checks it too)
        assert decoded.output_words == pytest.approx(sum(len(line.split()) for line in outputs) / 40)
        assert 0 <= run.bleu[beam] <= 100


def test_the_table_gives_each_target_its_median_seconds_and_ratio(joey):
    Run = joey.Run
    ours = [Run("attnseq", 0, [(30.0, 1000, 80.0), (60.0, 2000, 96.0)], 70.0),
            Run("attnseq", 1, [(40.0, 1000, 91.0), (80.0, 2000, 94.0)], 90.0)]
    theirs = [Run("JoeyNMT 2.3.0", 0, [(100.0, 1000, 91.0), (200.0, 2000, 95.5)], 210.0),
              Run("JoeyNMT 2.3.0", 1, [(120.0, 1000, 92.0), (240.0, 2000, 96.0)], 250.0)]
    table = joey.render({"attnseq": ours, "JoeyNMT 2.3.0": theirs}, (90.0, 95.0), "cmd",
                        {"train": 50000, "val": 1000, "test": 1000})
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in table.splitlines() if line.startswith("| 9")}
    assert rows["90"][:3] == ["50", "110", "**0.45×**"]  # medians (60+40)/2 and (100+120)/2
    t = (50 - 110) / (200 / 2 + 200 / 2) ** 0.5  # Welch's t of [60, 40] and [100, 120]: variances 200, df 2
    assert float(rows["90"][3]) == pytest.approx(2 * stats.t.sf(abs(t), df=2), abs=1e-3)
    assert rows["95"][:4] == ["not reached", "220", "–", "–"]  # seed 1 never reached it: no median over the others
    assert rows["95"][4] == "2,000,– / 2,000,2,000"
    # seconds per 1,000 updates to each run's last validation: 30, 40 against 100, 120 (medians 35, 110)
    pace = next(line for line in table.splitlines() if line.startswith("Seconds per 1,000 updates"))
    assert "attnseq 35, JoeyNMT 110: **0.32×**" in pace
    t = (35 - 110) / (50 / 2 + 200 / 2) ** 0.5  # Welch's t of [30, 40] and [100, 120]
    df = (50 / 2 + 200 / 2) ** 2 / ((50 / 2) ** 2 + (200 / 2) ** 2)  # Welch-Satterthwaite: 1 each side
    assert f"Welch p = {2 * stats.t.sf(abs(t), df=df):.3f}" in pace


def test_a_seed_that_never_reached_the_target_counts_as_the_slowest(joey):
    """JoeyNMT's seed 0 never reached 95 (as in a full run): the median is the higher of the other two, not 'not
    reached' for the whole side, and the row has no Welch test (a censored seed has no seconds to test)."""
    Run = joey.Run
    ours = [Run("attnseq", seed, [(seconds, 2000, 96.0)], seconds + 5) for seed, seconds in ((0, 60.0), (1, 64.0),
                                                                                            (2, 70.0))]
    theirs = [Run("JoeyNMT 2.3.0", 0, [(300.0, 2000, 93.9), (900.0, 6000, 93.91)], 903.0),
              Run("JoeyNMT 2.3.0", 1, [(237.0, 2000, 95.2)], 240.0),
              Run("JoeyNMT 2.3.0", 2, [(182.0, 2000, 95.1)], 185.0)]
    assert joey.medians({"attnseq": ours, "JoeyNMT 2.3.0": theirs}, 95.0) == (64.0, 237.0)
    pair = {"attnseq": ours, "JoeyNMT 2.3.0": theirs[:2]}
    assert joey.medians(pair, 95.0) == (64.0, None)  # the higher middle of two is not reached
    table = joey.render({"attnseq": ours, "JoeyNMT 2.3.0": theirs}, (95.0,), "cmd",
                        {"train": 50000, "val": 1000, "test": 1000})
    row = next([cell.strip() for cell in line.split("|")[2:-1]] for line in table.splitlines()
               if line.startswith("| 95"))
    assert row[:4] == ["64", "237", f"**{64 / 237:.2f}×**", "–"]


def test_the_decoding_table_gives_each_beam_its_medians_speed_up_and_welch_p(joey):
    """Medians over the seeds where both sides decoded; the speed-up is JoeyNMT's seconds over attnseq's; Welch's
    p of the translations alone against scipy; a seed where one side has no model drops out of that beam's row."""
    Run, Decoding = joey.Run, joey.Decoding
    ours = [Run("attnseq", seed, [(60.0, 2000, 96.0)], 70.0, "run", {1: Decoding(5.0, own, 9.0)}, {1: bleu})
            for seed, own, bleu in ((0, 0.2, 99.0), (1, 0.4, 98.0), (2, 0.3, 97.0))]
    theirs = [Run("JoeyNMT 2.3.0", seed, [(120.0, 2000, 96.0)], 130.0, "ckpt", {1: Decoding(4.0, own, 9.5)},
                  {1: 95.0}) for seed, own in ((0, 1.0), (1, 1.4), (2, 1.2))]
    ours[2].decodings[5] = Decoding(6.0, 0.9, 9.0)
    ours[2].bleu[5] = 97.5
    theirs[2].decodings[5] = Decoding(4.5, 1.8, 9.0)
    theirs[2].bleu[5] = 96.0
    table = joey.render({"attnseq": ours, "JoeyNMT 2.3.0": theirs}, (95.0,), "cmd",
                        {"train": 50000, "val": 1000, "test": 1000})
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in table.splitlines() if line.startswith(("| greedy", "| beam"))}
    assert rows["greedy"][:2] == ["1.20 / 0.30", "**4.00×**"]
    t = (0.3 - 1.2) / (0.01 / 3 + 0.04 / 3) ** 0.5  # Welch's t of [0.2, 0.4, 0.3] and [1.0, 1.4, 1.2]
    df = (0.01 / 3 + 0.04 / 3) ** 2 / ((0.01 / 3) ** 2 / 2 + (0.04 / 3) ** 2 / 2)
    assert float(rows["greedy"][2]) == pytest.approx(2 * stats.t.sf(abs(t), df=df), abs=1e-3)
    assert rows["greedy"][3:] == ["4.0 / 5.0", "0.80×", "95.00 / 98.00", "9.5 / 9.0"]
    assert rows["beam 5"][:3] == ["1.80 / 0.90", "**2.00×**", "—"]  # one seed: no test
