"""benchmarks/kernel_blocks.py times the additive kernels' buffers in blocks against one block of every step."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS, imported


def test_every_shape_and_block_size_is_timed_and_both_copies_train_in_lock_step():
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "kernel_blocks.py"), "--rounds", "1", "--repeats", "1", "--steps", "2",
         "--windows", "2", "--threads", "1", "--case", "gru/additive/luong-nofeed", "--case", "gru/concat/bahdanau"],
        capture_output=True, text=True, timeout=900, cwd=BENCHMARKS,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    kernel = re.findall(r"^\| (\d) \| (\d+) × (\d+) \| (\d+) \| ((?:[0-9.]+ \| )+)([0-9.]+)× \|$", done.stdout, re.M)
    with imported("kernel_blocks") as module:
        assert [(int(h), int(d), int(e), int(a)) for h, d, e, a, _, _ in kernel] == list(module.SHAPES)
        sizes = 1 + len(module.BLOCKS)  # one block, then each block size
        default_column = 1 + module.BLOCKS.index(module.buffers.BLOCK_BYTES)
    for *_, cells, ratio in kernel:
        times = [float(cell) for cell in cells.strip(" |").split(" | ")]
        assert len(times) == sizes and all(time > 0 for time in times)
        assert float(ratio) == pytest.approx(times[0] / times[default_column], rel=0.02, abs=0.01)
    steps = re.findall(r"^\| ([a-z]+/[a-z]+/[a-z-]+) \| ([0-9,]+) \| ([0-9,]+) \| ([0-9.]+)× \| ([0-9., ]+) \| "
                       r"([0-9,]+) / ([0-9,]+) \|$", done.stdout, re.M)
    assert [row[0] for row in steps] == ["gru/additive/luong-nofeed", "gru/concat/bahdanau"]
    for _, blocks, one_block, ratio, windows, *faults in steps:
        assert float(blocks.replace(",", "")) > 0 and float(one_block.replace(",", "")) > 0
        assert len(windows.split(", ")) == 2 and float(ratio) > 0
        assert all(float(count.replace(",", "")) >= 0 for count in faults)


@pytest.mark.parametrize("argument", [["--rounds", "0"], ["--steps", "-1"], ["--case", "gru/additive/nowhere"]])
def test_a_bad_value_is_refused_with_exit_2_naming_it(argument):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "kernel_blocks.py"), *argument],
                          capture_output=True, text=True, timeout=300, cwd=BENCHMARKS)
    assert done.returncode == 2 and argument[0] in done.stderr
