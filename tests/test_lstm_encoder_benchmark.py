"""benchmarks/lstm_encoder.py times the LSTM encoder by length against packed sequences."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from benchmark_scripts import BENCHMARKS, imported


@pytest.mark.parametrize("longest,distinct,spread", [(22, 1, "narrow"), (22, 3, "narrow"), (40, 12, "wide")])
def test_a_batch_holds_the_lengths_asked_for_padded_with_zero(longest, distinct, spread):
    with imported("lstm_encoder") as module:
        src, lengths = module.batch(longest, distinct, spread)
    assert src.shape == (module.BATCH, longest) and int(lengths.max()) == longest
    assert len(torch.unique(lengths)) == distinct  # 64 draws among them: each drawn (a fixed seed)
    if spread == "narrow":
        assert int(lengths.min()) >= longest - distinct + 1
    past = torch.arange(longest)[None, :] >= lengths[:, None]  # (B, T)
    assert torch.all(src[past] == 0) and torch.all(src[~past] > 0)


def test_every_row_is_timed_both_ways_with_their_ratio():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "lstm_encoder.py"), "--rounds", "1", "--repeats", "1",
                           "--threads", "1"], capture_output=True, text=True, timeout=600, cwd=BENCHMARKS)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (\d+) \| (\d+) \| (\d+)% \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+)× \|$", done.stdout, re.M)
    with imported("lstm_encoder") as module:
        assert [int(row[0]) for row in rows] == [longest for longest, _, _ in module.GRID]
    for _, _, _, by_length, packed, ratio in rows:
        assert float(by_length) > 0 and float(packed) > 0
        assert float(ratio) == pytest.approx(float(by_length) / float(packed), abs=0.01 + 0.01 * float(ratio))


def test_a_bad_value_is_refused_with_exit_2():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "lstm_encoder.py"), "--rounds", "0"],
                          capture_output=True, text=True, timeout=120, cwd=BENCHMARKS)
    assert done.returncode == 2 and "--rounds" in done.stderr
