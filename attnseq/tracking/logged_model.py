"""Logging a training run's model as an MLflow model: a pyfunc "from code" (``attnseq/serving/pyfunc_model.py``),
listed under the run's and the experiment's *Logged models*, registrable, and usable with
``mlflow models predict`` / ``serve`` as ``runs:/<run id>/model`` (``paths.MLFLOW_MODEL``).

The model carries the run's model file, resolved config, vocabularies and (subword runs) tokenizers
as artifacts, a copy of
the ``attnseq`` package as its code, a signature with a params schema (``beam_size``,
``length_penalty``, ``n_best``) and the n-best columns as optional outputs, an input example, and
explicit pip requirements, so MLflow never loads the model in a subprocess to infer them.

MLflow's ``Model.log`` reads the process-wide tracking URI. It is set to the run's own store for
the call only (``logging_scope``), and the URI, the environment and ``sys.path`` (which loading the
model to validate the input example extends) are put back afterwards.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import tokenizers
import torch
import yaml
from mlflow.entities import LoggedModel, Metric
from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR as PROGRESS_BAR
from mlflow.environment_variables import MLFLOW_TRACKING_URI
from mlflow.models import Model, ModelSignature
from mlflow.tracking import MlflowClient
from mlflow.types.schema import Array, ColSpec, ParamSchema, ParamSpec, Schema

import attnseq
from attnseq.tracking import paths

MODEL_FILE = "model_file"
CONFIG = "config"
SRC_VOCAB = "src_vocab"
TGT_VOCAB = "tgt_vocab"
SRC_TOKENIZER = "src_tokenizer"
TGT_TOKENIZER = "tgt_tokenizer"
"""The model's artifacts, by the name ``context.artifacts`` gives them under (the tokenizers: subword runs only)."""

SOURCE_COLUMN = "source"
OUTPUT_COLUMN = "output"
N_BEST_COLUMNS = ("outputs", "scores", "log_probs")
"""With ``n_best`` > 1, beside ``output`` (the best): each source's n best texts, best first, their ranking
scores (log p / GNMT's lp(length), log p at α = 0) and their log-probabilities, a list each."""
DEFAULT_PARAMS = {"beam_size": 1, "length_penalty": 0.0, "n_best": 1}
"""Greedy decoding unless a request asks for a beam; the best output alone unless it asks for more."""

PACKAGE_DIR = Path(attnseq.__file__).parent
CODE_FILE = PACKAGE_DIR / "serving" / "pyfunc_model.py"

SIGNATURE = ModelSignature(
    inputs=Schema([ColSpec("string", SOURCE_COLUMN)]),
    outputs=Schema([
        ColSpec("string", OUTPUT_COLUMN),
        *(ColSpec(Array(kind), name, required=False)
          for name, kind in zip(N_BEST_COLUMNS, ("string", "double", "double"))),
    ]),
    params=ParamSchema([
        ParamSpec("beam_size", "long", DEFAULT_PARAMS["beam_size"]),
        ParamSpec("length_penalty", "double", DEFAULT_PARAMS["length_penalty"]),
        ParamSpec("n_best", "long", DEFAULT_PARAMS["n_best"]),
    ]),
)


def pip_requirements() -> list[str]:
    """What the model imports, at the versions that logged it (``attnseq`` itself travels as code)."""
    return [
        f"mlflow=={mlflow.__version__}",
        f"torch=={torch.__version__.split('+')[0]}",
        f"numpy=={np.__version__}",
        f"pandas=={pd.__version__}",
        f"pyyaml=={yaml.__version__}",
        f"tokenizers=={tokenizers.__version__}",
    ]


@contextmanager
def logging_scope(client: MlflowClient) -> Iterator[None]:
    """Inside the block only: MLflow's process-wide tracking URI is ``client``'s store, and what
    ``Model.log`` would print about copying local files (progress bars, its check of the input
    example) is left out. Everything it changes is put back, ``sys.path`` included."""
    saved_env = {name: os.environ.get(name) for name in (MLFLOW_TRACKING_URI.name, PROGRESS_BAR.name)}
    # set by mlflow.set_tracking_uri, or None: only the environment (or nothing) sets it
    saved_uri = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    if saved_uri == saved_env[MLFLOW_TRACKING_URI.name]:
        saved_uri = None  # the environment's: put back below
    saved_path = list(sys.path)
    pyfunc_logger = logging.getLogger(mlflow.pyfunc.__name__)
    saved_level = pyfunc_logger.level
    mlflow.set_tracking_uri(client.tracking_uri)
    os.environ[PROGRESS_BAR.name] = "false"
    pyfunc_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        pyfunc_logger.setLevel(saved_level)
        mlflow.set_tracking_uri(saved_uri)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        sys.path[:] = saved_path


def log_translator(
    client: MlflowClient,
    run_id: str,
    model_file: Path,
    config_file: Path,
    src_vocab_file: Path,
    tgt_vocab_file: Path,
    example_sources: Sequence[str],
    step: int = 0,
    tokenizer_files: tuple[Path, Path] | None = None,
    model_config: dict | None = None,
    name: str = paths.MLFLOW_MODEL,
    linked: Callable[[str], bool] | None = None,
    model_tags: dict[str, str] | None = None,
) -> LoggedModel:
    """Log the MLflow model ``name`` (by default ``paths.MLFLOW_MODEL``) of run ``run_id``, in the
    run's experiment, with ``model_tags``.

    ``tokenizer_files``: the (source, target) tokenizers' JSON of a subword run. ``model_config``: the
    model's MLflow ``model_config`` (what one request may cost), which a server may override.

    ``step``: when the run output the model. The final value of each of the run's metrics (those
    ``linked`` picks by name, by default all) is linked to the model, so the *Logged models* table
    shows them.
    """
    run = client.get_run(run_id)
    logged = client.create_logged_model(
        experiment_id=run.info.experiment_id,
        name=name,
        source_run_id=run_id,
        params=dict(run.data.params),
        tags=model_tags,
        model_type="attnseq.seq2seq",
    )
    with logging_scope(client):
        Model.log(
            artifact_path=None,  # deprecated, yet a required argument
            name=name,
            flavor=mlflow.pyfunc,
            flavor_name="pyfunc.ModelFromCode",
            run_id=run_id,
            model_id=logged.model_id,
            step=step,
            python_model=str(CODE_FILE),
            artifacts={
                MODEL_FILE: str(model_file),
                CONFIG: str(config_file),
                SRC_VOCAB: str(src_vocab_file),
                TGT_VOCAB: str(tgt_vocab_file),
                **({} if tokenizer_files is None else
                   {SRC_TOKENIZER: str(tokenizer_files[0]), TGT_TOKENIZER: str(tokenizer_files[1])}),
            },
            code_paths=[str(PACKAGE_DIR)],
            signature=SIGNATURE,
            input_example=pd.DataFrame({SOURCE_COLUMN: list(example_sources)}),
            pip_requirements=pip_requirements(),
            model_config=model_config,
        )
    link_final_metrics(client, run_id, logged.model_id, linked)
    return client.get_logged_model(logged.model_id)


def link_final_metrics(client: MlflowClient, run_id: str, model_id: str,
                       picked: Callable[[str], bool] | None = None) -> None:
    """Each metric's last point (step, then time) logged again with ``model_id``: the same point, so
    the run's history does not change; only the metrics ``picked`` names (all by default). Those
    MLflow linked already (logged at the model's step) stay."""
    linked = {metric.key for metric in client.get_logged_model(model_id).metrics or []}
    final = []
    for key in client.get_run(run_id).data.metrics:
        if key not in linked and (picked is None or picked(key)):
            last = max(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
            final.append(Metric(key, last.value, last.timestamp, last.step, model_id=model_id, run_id=run_id))
    if final:
        client.log_batch(run_id, metrics=final)
