"""The MLflow model's code ("models from code"): MLflow executes this file to obtain the model, so
no model object is ever pickled. Do not import it; ``attnseq.tracking.logged_model.log_translator``
names its path.

Input: a table with a ``source`` column of source texts (``"s3 s1 s4"``). Output: a table with an
``output`` column of decoded texts; with ``n_best`` > 1 also ``outputs``, ``scores`` and ``log_probs``,
each source's n best texts (the first is ``output``), their ranking scores and log-probabilities, as
lists. Params: ``beam_size`` (1: greedy), ``length_penalty`` (GNMT's α) and ``n_best`` (≤ ``beam_size``);
the model's ``model_config``: what one request may cost (``RequestLimits``).
"""

from __future__ import annotations

from numbers import Integral

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel

from attnseq.serving.predictor import InvalidSource, RequestLimits, Translator
from attnseq.tracking.logged_model import (
    CONFIG,
    DEFAULT_PARAMS,
    MODEL_FILE,
    N_BEST_COLUMNS,
    OUTPUT_COLUMN,
    SOURCE_COLUMN,
    SRC_TOKENIZER,
    SRC_VOCAB,
    TGT_TOKENIZER,
    TGT_VOCAB,
)


class TranslatorModel(PythonModel):
    def load_context(self, context) -> None:
        import os

        from attnseq.registry import PLUGINS_ENV, import_plugins

        # a run's plugins run code: imported only when the one serving names them (PLUGINS_ENV)
        import_plugins(name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip())
        files = context.artifacts
        self.translator = Translator.from_files(files[MODEL_FILE], files[CONFIG], files[SRC_VOCAB], files[TGT_VOCAB],
                                                files.get(SRC_TOKENIZER), files.get(TGT_TOKENIZER),
                                                RequestLimits.of(context.model_config))

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        """``model_input``: the signature's table (MLflow has checked its ``source`` column)."""
        settings = {**DEFAULT_PARAMS, **(params or {})}
        sources = model_input[SOURCE_COLUMN].tolist()
        beam_size, alpha = settings["beam_size"], settings["length_penalty"]
        n_best = settings["n_best"]
        try:
            if isinstance(n_best, Integral) and not isinstance(n_best, bool) and n_best == 1:  # True is refused below
                return pd.DataFrame({OUTPUT_COLUMN: self.translator.translate(sources, beam_size, alpha)})
            found = self.translator.translate_n_best(sources, beam_size, n_best, alpha)
        except InvalidSource as error:
            raise MlflowException(str(error), error_code=INVALID_PARAMETER_VALUE) from None
        outputs, scores, log_probs = N_BEST_COLUMNS
        return pd.DataFrame({
            OUTPUT_COLUMN: [best[0].output if best else "" for best in found],
            outputs: [[h.output for h in best] for best in found],
            scores: [[h.score for h in best] for best in found],
            log_probs: [[h.log_prob for h in best] for best in found],
        })


mlflow.models.set_model(TranslatorModel())
