"""What a served model's answers must be: each source decoded alone by the model library, from the
run's own model file as evaluation rebuilds it (``test_mlflow_model``, ``test_transformer_decoder``)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient

from attnseq.evaluation.trained_runs import load_trained_run
from attnseq.model import beam_search, beam_search_n_best, greedy_decode
from attnseq.tracking.client import TrackingClient


def expected_outputs(uri: str, run_id: str, sources: list[str], beam_size: int = 1, length_penalty: float = 0.0,
                     n_best: int | None = None) -> list:
    """Each source decoded alone by the model library, from the run's model file as evaluation rebuilds it:
    its output text, or with ``n_best`` its n best as ``(texts, ranking scores, log-probabilities)``."""
    client = MlflowClient(uri)
    rebuilt = load_trained_run(TrackingClient(uri), client.get_run(run_id))
    ratio, extra = rebuilt.config["decode"]["max_length_ratio"], rebuilt.config["decode"]["max_length_extra"]

    def text(ids: list[int]) -> str:
        words = rebuilt.tgt_vocab.decode(ids)
        return " ".join(words[:-1] if words[-1:] == ["</s>"] else words)

    outputs = []
    for source in sources:
        tokens = source.split()
        src = torch.tensor([rebuilt.src_vocab.encode(tokens)])  # (1, T_src)
        lengths = torch.tensor([len(tokens)])  # (1,)
        limit = int(len(tokens) * ratio) + extra
        if n_best is not None:
            found = beam_search_n_best(rebuilt.model, src, lengths, beam_size, n_best, limit,
                                       length_penalty=length_penalty)
            outputs.append(([text(found.tokens[0, k, : int(found.lengths[0, k])].tolist()) for k in range(n_best)],
                            found.rank_scores[0].tolist(), found.scores[0].tolist()))
            continue
        if beam_size == 1:
            decoded = greedy_decode(rebuilt.model, src, lengths, max_length=limit)
        else:
            decoded = beam_search(rebuilt.model, src, lengths, beam_size, limit, length_penalty=length_penalty)
        outputs.append(text(decoded.tokens[0, : int(decoded.lengths[0])].tolist()))
    return outputs


def assert_n_best_as_the_library(table: pd.DataFrame, expected: list) -> None:
    """A served n-best table (``output``, ``outputs``, ``scores``, ``log_probs``) against ``expected_outputs``'s."""
    assert list(table.columns) == ["output", "outputs", "scores", "log_probs"]
    for (_, row), (texts, scores, log_probs) in zip(table.iterrows(), expected, strict=True):
        assert row["output"] == texts[0] and list(row["outputs"]) == texts
        assert list(row["scores"]) == pytest.approx(scores, abs=1e-5)
        assert list(row["log_probs"]) == pytest.approx(log_probs, abs=1e-5)
