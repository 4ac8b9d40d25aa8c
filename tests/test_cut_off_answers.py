"""A tracking server that stops while answering cuts its answer off mid-body; urllib3 does not retry
that, so ``TrackedRun`` sends the batch again, waited for and asynchronous alike. The server here is
a stub on loopback that cuts off its first answers to ``runs/log-batch`` and records every request."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mlflow.tracking import MlflowClient

from attnseq.tracking.retry import TrackingUnavailable, answer_cut_off, retry_settings
from attnseq.tracking.run import TrackedRun

RUN_ID = "0123456789abcdef0123456789abcdef"


class CuttingServer(ThreadingHTTPServer):
    def __init__(self, cut_first: int) -> None:
        super().__init__(("127.0.0.1", 0), CuttingHandler)
        self.cut_first = cut_first
        self.batches: list[dict] = []  # every log-batch request's body, cut off or not
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class CuttingHandler(BaseHTTPRequestHandler):
    server: CuttingServer

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.batches.append(body)
            cut = len(self.server.batches) <= self.server.cut_first
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100" if cut else "2")
        self.end_headers()
        self.wfile.write(b"{" if cut else b"{}")  # cut: 99 bytes promised never come
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def cutting_server(request, monkeypatch):
    server = CuttingServer(cut_first=request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for name, value in retry_settings(10).items():  # what the entry point's runtime sets
        monkeypatch.setenv(name, value)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def metric_steps(batches: list[dict]) -> list[int]:
    return [int(metric["step"]) for batch in batches for metric in batch.get("metrics", [])]


@pytest.mark.parametrize("cutting_server", [2], indirect=True)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["waited", "asynchronous"])
def test_a_batch_whose_answer_was_cut_off_is_sent_again(monkeypatch, cutting_server, asynchronous):
    monkeypatch.setenv("MLFLOW_ENABLE_ASYNC_LOGGING", str(asynchronous).lower())
    run = TrackedRun(MlflowClient(cutting_server.url), RUN_ID, "cut")
    assert run.asynchronous is asynchronous
    run.log_metrics({"m": 1.0}, step=7)
    run.flush()
    # two answers cut off, the third read whole: the same batch three times, nothing else
    assert len(cutting_server.batches) == 3
    assert all(batch == cutting_server.batches[0] for batch in cutting_server.batches)
    assert metric_steps(cutting_server.batches[:1]) == [7]
    assert run.lost is None
    run.log_metrics({"m": 2.0}, step=8)  # the run goes on
    run.flush()
    assert metric_steps(cutting_server.batches[3:]) == [8]


@pytest.mark.parametrize("cutting_server", [1000], indirect=True)
def test_answers_cut_off_past_the_budget_stop_the_run(monkeypatch, cutting_server):
    monkeypatch.setenv("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
    run = TrackedRun(MlflowClient(cutting_server.url), RUN_ID, "cut")
    with pytest.raises(TrackingUnavailable, match="stopped answering: logging metrics failed"):
        run.log_metrics({"m": 1.0}, step=1)
    tries = len(cutting_server.batches)
    assert 3 <= tries <= 5  # sleeps of 1, 2, 4 s fit a 10 s budget, 8 s more does not
    with pytest.raises(TrackingUnavailable):  # every later call at once, nothing sent
        run.log_metrics({"m": 2.0}, step=2)
    assert len(cutting_server.batches) == tries


def test_only_a_cut_off_answer_counts_as_one():
    from requests.exceptions import ChunkedEncodingError, ConnectionError
    from urllib3.exceptions import ProtocolError

    cut = ChunkedEncodingError(ProtocolError("Connection broken: IncompleteRead(1 bytes read, 99 more expected)"))
    assert answer_cut_off(cut)
    assert not answer_cut_off(ConnectionError("Connection refused"))
    assert not answer_cut_off(ValueError("bad param"))
