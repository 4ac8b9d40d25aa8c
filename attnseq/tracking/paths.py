"""Where each artifact lives inside a run, each path named once.

A training run's output folder keeps the same layout for its checkpoints
(``<output_dir>/checkpoints/last.ckpt``), so the two are found the same way.
"""

from __future__ import annotations

from pathlib import PurePosixPath

RESOLVED_CONFIG = "config/resolved.yaml"
"""The resolved training config, secrets masked: what ``resume=`` and evaluation rebuild from."""
SRC_VOCAB = "vocab/src.json"
TGT_VOCAB = "vocab/tgt.json"
SRC_TOKENIZER = "vocab/src_tokenizer.json"
TGT_TOKENIZER = "vocab/tgt_tokenizer.json"
"""A subword run's trained tokenizers (``bpe``, ``unigram``), as Hugging Face ``tokenizers`` JSON;
runs tokenised by a rule (``word``, ``char``, the synthetic tasks) have none."""
MODEL_SUMMARY = "weights/summary.txt"
MODEL_FILE = "weights/model.pt"
"""The model's config and weights, loadable with ``torch.load(weights_only=True)``: what evaluate.py
and the MLflow model rebuild the model from."""
LEGACY_MODEL_FILE = "model/model.pt"
"""Where runs made before the MLflow model existed keep ``MODEL_FILE``; evaluation still reads them."""
MLFLOW_MODEL = "model"
"""The name of the run's MLflow model (a logged model): ``runs:/<run id>/model``. No artifact folder of
the run is called ``model``: MLflow would list the logged model inside it, looking it up in the
process-wide store rather than the client's (MLflow 3.17)."""
AVERAGED_MODEL = "averaged_model"
"""The name of a training run's averaged model (``average.k``): ``runs:/<run id>/averaged_model``, the
mean of its ``average.k`` last or best checkpoints, logged like ``MLFLOW_MODEL``."""
AVERAGED_MODEL_FILE = "weights/averaged_model.pt"
"""The averaged model's config and weights, as ``MODEL_FILE`` holds the run's model."""
CHECKPOINTS = "checkpoints"
LAST_CHECKPOINT = "checkpoints/last.ckpt"

BUCKET_TABLE = "tables/val_length_buckets.json"
"""The per-bucket validation table, one block of rows per epoch."""
LENGTH_FIGURE = "figures/accuracy_vs_length.png"
"""The final accuracy-vs-length figure (an evaluation's, or a training run's after its last epoch)."""
LENGTH_IMAGE = "length/accuracy_vs_length"
"""The key of a training run's time-stepped accuracy-vs-length figure: one per validation, so the UI's
slider shows the curve evolve."""
COUNTERFACTUAL_FIGURE = "figures/counterfactual.png"
EXPLORER = "explorer/attention_explorer.html"
"""The attention explorer (``attnseq.tracking.explorer``): one self-contained HTML page, a training run's (at
its end: its heatmap samples, every logged epoch's attention) and an evaluation run's (``eval.explorer_samples``
examples spread over the evaluated lengths)."""


def attention_image(label: str) -> str:
    """The key of a training run's time-stepped heatmap (``short``, ``medium``, ``long``).

    Every time-stepped image's step is the step the validation metrics of that epoch have, so the
    UI's image slider and metric charts share one axis (the run's ``epoch`` metric maps it to epochs).
    """
    return f"attention/{label}"


def heatmap_file(label: str) -> str:
    """A training run's heatmap of its last epoch's model, as a plain file: the trained heatmap found in
    the Artifacts tab, without the time-stepped image's slider."""
    return f"attention/{label}.png"


def best_heatmap_file(label: str) -> str:
    """A training run's heatmap of its best checkpoint (the one its MLflow model serves)."""
    return f"attention/best_{label}.png"


def self_attention_image(stack: str, label: str) -> str:
    """The key of a training run's time-stepped self-attention figure of sample ``label``, for ``stack``
    (``encoder``, ``decoder``: a Transformer's; a row per layer), stepped as ``attention_image``. Short, so
    that the *Model metrics* tab's card titles (about 30 characters before MLflow cuts them) tell
    ``self_attention/decoder_short`` from ``self_attention/decoder_long``; its section is ``self_attention``."""
    return f"self_attention/{stack}_{label}"


SELF_ATTENTION_FOLDER = "attention/self_attention"
"""A training run's plain self-attention figures: beside its heatmaps, in the ``attention`` folder."""


def self_attention_file(stack: str, label: str, best: bool = False) -> str:
    """A training run's self-attention figure of its last epoch's model (``best``: of its best
    checkpoint), as a plain file beside ``heatmap_file``'s."""
    return f"{SELF_ATTENTION_FOLDER}/{stack}_{'best_' if best else ''}{label}.png"


EVAL_TABLES = "eval"
"""An evaluation run's per-bucket tables (``buckets.json``, ``buckets.csv``), and with ``eval.n_best`` > 1
its n-best table (``N_BEST_TABLE``)."""
N_BEST_TABLE = "n_best.csv"
"""Each example's n best hypotheses, a row each (``attnseq.evaluation.evaluator.N_BEST_COLUMNS``)."""


def long_heatmap(index: int, source_length: int) -> str:
    """An evaluation run's heatmap of one of its longest examples."""
    return f"heatmaps/long_{index}_len{source_length}.png"


COMPARISON = "comparison"
"""A comparison run's figures and tables."""
def sentence_heatmap(index: int) -> str:
    """An evaluation run's heatmap of the ``index``-th text of ``eval.sentences``."""
    return f"heatmaps/sentence_{index}.png"


def self_attention_beside(stack: str, heatmap: str) -> str:
    """The self-attention figure for ``stack`` (``encoder``, ``decoder``) of the sample whose cross-attention
    heatmap is ``heatmap``: beside it, in a ``self_attention/`` folder, named ``<stack>_<heatmap's name>``. An
    evaluation run's (``long_heatmap``, ``sentence_heatmap``: ``heatmaps/self_attention/``), a comparison
    run's (``SAME_SAMPLE_HEATMAPS``, ``comparison_sentence_heatmaps``: ``comparison/self_attention/``) and
    ``translate.py heatmaps=``'s files (``<folder>/self_attention/encoder_source_0.png``)."""
    return f"{folder(heatmap)}/self_attention/{stack}_{file_name(heatmap)}"


def comparison_sentence_heatmaps(index: int) -> str:
    """A comparison run's heatmaps of the ``index``-th text of ``eval.sentences``, one panel per run."""
    return f"comparison/sentence_{index}_heatmaps.png"


COMPARISON_EXPLORER = "comparison/attention_explorer.html"
"""A comparison run's attention explorer: the same examples as each attending run attends to them, two side by
side with their difference and each step's Jensen–Shannon divergence."""
SAME_SAMPLE_HEATMAPS = "comparison/same_sample_heatmaps.png"
"""A comparison run's heatmaps of one source sequence, one panel per evaluated run."""
SWEEP_SUMMARY = "sweep_summary.txt"


def folder(artifact: str) -> str:
    """The folder an artifact path lies in: ``weights/model.pt`` → ``weights``."""
    return str(PurePosixPath(artifact).parent)


def file_name(artifact: str) -> str:
    """The file name of an artifact path: ``weights/model.pt`` → ``model.pt``."""
    return PurePosixPath(artifact).name
