"""benchmarks/remote_tracking.py --backlog: records queued while a real ``mlflow server`` stalls (SIGSTOP),
then what sending them takes once it answers again."""

from __future__ import annotations

import pytest
from benchmark_scripts import imported  # tests/ on sys.path


@pytest.fixture(scope="module")
def remote_tracking():
    with imported("remote_tracking") as module:
        yield module


@pytest.mark.slow
def test_a_stalled_servers_backlog_is_stored_whole_in_a_few_calls(remote_tracking):
    found = remote_tracking.backlog(sizes=(40, 120), repeats=1, log=lambda line: None)  # raises if one is lost
    rows = found["rows"]
    assert [row["records"] for row in rows] == [40, 120]
    assert all(1 <= row["calls"] <= 4 for row in rows), rows  # the first record alone, then the rest merged
    assert all(row["seconds"] > 0 for row in rows)
    table = remote_tracking.render_backlog(found)
    assert "| 120 |" in table
