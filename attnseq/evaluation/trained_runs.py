"""Finding trained runs in MLflow and rebuilding each model from the run's own artifacts
(its resolved config, vocabularies, tokenizers and model file) — no Hydra command line needed.

Nothing is unpickled: the config is YAML, the vocabularies and tokenizers JSON, and the weights are
read with ``torch.load(..., weights_only=True)``. A run that is not an attnseq training run, and an
artifact that is missing or cannot be read, are a ``ConfigError`` naming the run and the artifact.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from mlflow.entities import Run

from attnseq.config import EvalConfig
from attnseq.data import Vocabulary
from attnseq.data.tasks import tokenizer_for
from attnseq.data.tokenizers import SUBWORD_TOKENIZERS, SYMBOLS, RuleTokenizer, TextTokenizer
from attnseq.errors import ConfigError
from attnseq.evaluation.validation import EXAMPLE_FILTER
from attnseq.model import Seq2Seq, load_saved_model
from attnseq.registry import closest
from attnseq.tracking import paths, tags
from attnseq.tracking.client import NoSuchRun, TrackingClient
from attnseq.tracking.redaction import redact, redact_text
from attnseq.tracking.store import check_store_to_read

T = TypeVar("T")
KIND_NAMES = {tags.SWEEP: "sweep's parent", tags.EVALUATION: "evaluation", tags.COMPARISON: "comparison"}


@dataclass
class TrainedRun:
    run: Run
    config: dict[str, Any]  # the resolved training config
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    model: Seq2Seq
    src_tokenizer: TextTokenizer = RuleTokenizer(SYMBOLS)  # how the run read its text (and detokenises outputs)
    tgt_tokenizer: TextTokenizer = RuleTokenizer(SYMBOLS)
    model_name: str = paths.MLFLOW_MODEL  # which of the run's models: its own, or paths.AVERAGED_MODEL

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    @property
    def name(self) -> str:
        """The run's name; with its averaged model, saying so (``<run name> · averaged_model``)."""
        name = self.run.info.run_name or self.run_id
        return name if self.model_name == paths.MLFLOW_MODEL else f"{name} · {self.model_name}"

    @property
    def train_lengths(self) -> tuple[int, int]:
        lo, hi = self.config["dataset"]["train_lengths"]
        return int(lo), int(hi)


def get_run(client: TrackingClient, run_id: str) -> Run:
    try:
        return client.run(run_id)
    except NoSuchRun as error:
        raise ConfigError(
            f"no MLflow run with id {run_id!r} in the store {redact('', client.tracking_uri)} ({error.code}).",
            f"copy the id from the MLflow UI or from `{client.runs_list_command()}`, and check "
            "mlflow.tracking_uri (or MLFLOW_TRACKING_URI) points at the store that holds it.",
        ) from None


def searched_experiments(client: TrackingClient, experiment_name: str | None) -> list[str]:
    """The ids of the experiments to look in: ``experiment_name``'s, or every one."""
    if not experiment_name:
        return client.experiment_ids()
    return [named_experiment(client, experiment_name)]


def named_experiment(client: TrackingClient, experiment_name: str) -> str:
    """The id of experiment ``experiment_name``, or a ``ConfigError`` listing the store's experiments,
    the closest name first."""
    experiment_id = client.experiment_id(experiment_name)
    if experiment_id is not None:
        return experiment_id
    names = client.experiment_names()
    match = closest(experiment_name, names)
    held = f"it holds {', '.join(repr(name) for name in names[:20])}" + (" …" if len(names) > 20 else "") \
        if names else "it holds no experiment yet"
    raise ConfigError(f"no MLflow experiment named {experiment_name!r} in the store "
                      f"{redact('', client.tracking_uri)}: {held}.",
                      f"experiment_name={match}" if match else "pass one of those names as experiment_name=<name>, "
                      "or check mlflow.tracking_uri (or MLFLOW_TRACKING_URI) points at the store that holds it.")


def latest_sweep(client: TrackingClient, experiment_name: str | None) -> str:
    """The id of the most recent sweep's parent run (in ``experiment_name`` when given)."""
    experiment_ids = searched_experiments(client, experiment_name)
    sweeps = client.runs(experiment_ids, filter_string=tags.tag_equals(tags.KIND, tags.SWEEP),
                         order_by=["attributes.start_time DESC"], max_results=1)
    if not sweeps:
        raise ConfigError(
            f"no sweep found{f' in {experiment_name!r}' if experiment_name else ''}.",
            "run one first (`python train.py -m ...`), or pass parent_run_id=<id>.",
        )
    return sweeps[0].info.run_id


def latest_training_run(client: TrackingClient, experiment_name: str | None) -> Run:
    """The most recent finished training run (in ``experiment_name`` when given)."""
    experiment_ids = searched_experiments(client, experiment_name)
    query = f"{tags.tag_equals(tags.KIND, tags.TRAIN)} and attributes.status = 'FINISHED'"
    runs = client.runs(experiment_ids, filter_string=query, order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise ConfigError(
            f"no finished training run in the store {redact('', client.tracking_uri)}"
            f"{f' (experiment {experiment_name!r})' if experiment_name else ''}.",
            "train one first (`python train.py`), or check mlflow.tracking_uri (or MLFLOW_TRACKING_URI).",
        )
    return runs[0]


def chosen_runs(client: TrackingClient, cfg: EvalConfig) -> tuple[list[Run], str | None]:
    """The runs ``cfg`` chooses, and the sweep they came from (``parent_run_id=latest`` resolved once:
    the comparison run goes under the sweep itself)."""
    parent, experiment_name = cfg.parent_run_id, cfg.experiment_name
    if parent == "latest":
        parent, experiment_name = latest_sweep(client, experiment_name), None
    runs = select_runs(client, run_id=cfg.run_id, run_ids=cfg.run_ids, parent_run_id=parent,
                       experiment_name=experiment_name, filter_string=cfg.filter)
    return runs, parent


def check_selection(cfg: EvalConfig) -> None:
    """The store is there and holds the runs ``cfg`` chooses (the experiment, the run ids, the sweep):
    ``evaluate.py`` asks before Hydra makes the run folder, so a wrong one leaves nothing on disk and
    a missing SQLite store is not created."""
    check_store_to_read(cfg.mlflow.tracking_uri)
    chosen_runs(TrackingClient(cfg.mlflow.tracking_uri), cfg)


def select_runs(
    client: TrackingClient,
    run_id: str | None = None,
    run_ids: list[str] | None = None,
    parent_run_id: str | None = None,
    experiment_name: str | None = None,
    filter_string: str | None = None,
) -> list[Run]:
    """Exactly one way of choosing: a run, a list of runs, a sweep's children, or an experiment's
    training runs (optionally filtered with MLflow's search syntax). A sweep given as ``"latest"``
    is resolved by the caller (``latest_sweep``), which needs the real id for the comparison too."""
    chosen = [name for name, value in (("run_id", run_id), ("run_ids", run_ids), ("parent_run_id", parent_run_id),
                                       ("experiment_name", experiment_name)) if value]
    if len(chosen) != 1:
        raise ConfigError(
            f"choose the runs to evaluate in exactly one way; got {chosen or 'none'}.",
            "pass one of run_id=<id>, run_ids=[<id>,<id>], parent_run_id=<sweep parent id>, "
            f"or experiment_name=<name> (with an optional filter, e.g. {EXAMPLE_FILTER}).",
        )
    if run_id:
        return [get_run(client, run_id)]
    if run_ids:
        return [get_run(client, r) for r in run_ids]
    if parent_run_id:
        parent = get_run(client, parent_run_id)
        query = f"{tags.children_of(parent_run_id)} and {tags.tag_equals(tags.KIND, tags.TRAIN)}"
        runs = client.runs([parent.info.experiment_id], filter_string=query)
        if not runs:
            raise ConfigError(
                f"run {parent_run_id} has no training runs as children.",
                "pass the parent run of a sweep (`train.py -m ...` prints it at the end), or run_id=<id>.",
            )
        return sorted(runs, key=lambda r: int(r.data.tags.get(tags.JOB_NUM, 0)))
    experiment_id = named_experiment(client, experiment_name)
    query = f"{tags.tag_equals(tags.KIND, tags.TRAIN)} and attributes.status = 'FINISHED'"
    if filter_string:
        query += f" and {filter_string}"
    runs = client.runs([experiment_id], filter_string=query)
    if not runs:
        raise ConfigError(
            f"no finished training runs in {experiment_name!r} match {filter_string!r}.",
            "loosen the filter.",
        )
    return runs


def check_training_run(run: Run) -> None:
    """A ``ConfigError`` unless ``run`` is an attnseq training run (``tags.KIND``): only those hold a model."""
    kind = run.data.tags.get(tags.KIND)
    if kind == tags.TRAIN:
        return
    what = (f"not an attnseq training run (it has no '{tags.KIND}' tag: another tool made it)" if kind is None
            else f"an attnseq {KIND_NAMES.get(kind, repr(kind))} run, not a training run")
    raise ConfigError(
        f"run {run.info.run_id} ({run.info.run_name}) is {what}, so it holds no model to evaluate.",
        "pass the id of a run that `python train.py` made; for a sweep's runs, pass parent_run_id=<its parent's id>.",
    )


MODEL_FILES = {paths.MLFLOW_MODEL: paths.MODEL_FILE, paths.AVERAGED_MODEL: paths.AVERAGED_MODEL_FILE}
"""Each of a training run's models by name, and the file of config and weights it is rebuilt from."""


def load_trained_run(client: TrackingClient, run: Run, model_name: str = paths.MLFLOW_MODEL) -> TrainedRun:
    """Rebuild a run's model (``model_name``: its own, or its averaged one) from its artifacts; a clear
    error when the run is no training run, or when one of them is missing or cannot be read."""
    check_training_run(run)
    run_id = run.info.run_id
    about = f"run {run_id} ({run.info.run_name}, status {run.info.status})"
    with tempfile.TemporaryDirectory() as tmp:

        def checked(artifact: str, make: Callable[[], T]) -> T:
            try:
                return make()
            except Exception as error:  # noqa: BLE001 - whatever a damaged file raises, the artifact is at fault
                cause = redact_text(f"{type(error).__name__}: {error}".splitlines()[0][:300])
                raise ConfigError(
                    f"{about}: its '{artifact}' artifact cannot be read ({cause}), so its model cannot be rebuilt.",
                    f"the file is damaged in the run's artifact store: put back a good copy of '{artifact}', "
                    "or train the run again.",
                ) from None

        def read(artifact: str, parse: Callable[[Path], T]) -> T:
            places = (artifact, paths.LEGACY_MODEL_FILE) if artifact == paths.MODEL_FILE else (artifact,)
            local = _first_downloaded(client, run_id, places, tmp)
            if local is None and artifact == paths.AVERAGED_MODEL_FILE:
                raise ConfigError(
                    f"{about} has no averaged model ('{artifact}'): it was trained without average.k.",
                    "evaluate its own model (model=model), or train it again with average.k=<k>, e.g. average.k=5.",
                )
            if local is None:
                raise ConfigError(
                    f"{about} has no '{artifact}' artifact, so its model cannot be rebuilt.",
                    "evaluate a run that finished training (a run killed before its first epoch "
                    "ended has no checkpoint), or resume it first.",
                )
            return checked(artifact, lambda: parse(local))

        config = read(paths.RESOLVED_CONFIG, _training_config)
        src_vocab = read(paths.SRC_VOCAB, Vocabulary.load)
        tgt_vocab = read(paths.TGT_VOCAB, Vocabulary.load)
        dataset = config["dataset"]
        if dataset.get("tokenizer") in SUBWORD_TOKENIZERS:  # only a corpus task has a tokenizer key
            src_tokenizer, tgt_tokenizer = (
                read(artifact, lambda path: tokenizer_for(dataset, path.read_text(encoding="utf-8")))
                for artifact in (paths.SRC_TOKENIZER, paths.TGT_TOKENIZER)
            )
        else:
            src_tokenizer, tgt_tokenizer = (checked(paths.RESOLVED_CONFIG, lambda: tokenizer_for(dataset))
                                            for _ in ("source", "target"))
        model = read(MODEL_FILES[model_name], lambda path: _matching_model(path, len(src_vocab), len(tgt_vocab)))
    return TrainedRun(run, config, src_vocab, tgt_vocab, model, src_tokenizer, tgt_tokenizer, model_name)


def _training_config(path: Path) -> dict[str, Any]:
    """The resolved training config, with the dataset keys evaluation reads."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    dataset = config.get("dataset") if isinstance(config, dict) else None
    if not isinstance(dataset, dict):
        raise ValueError("not a training config: it has no 'dataset' section")
    lo, hi = dataset["train_lengths"]
    _ = int(lo), int(hi), int(dataset["bucket_width"])  # what evaluation reads of it: a KeyError or ValueError here
    return config


def _matching_model(path: Path, src_vocab_size: int, tgt_vocab_size: int) -> Seq2Seq:
    model = load_saved_model(path)
    sizes = (model.config.src_vocab_size, model.config.tgt_vocab_size)
    if sizes != (src_vocab_size, tgt_vocab_size):
        raise ValueError(f"its vocabulary sizes {sizes} are not the run's vocabularies' "
                         f"({src_vocab_size}, {tgt_vocab_size})")
    return model


def _first_downloaded(client: TrackingClient, run_id: str, places: tuple[str, ...], into: str) -> Path | None:
    """The first of ``places`` the run holds, downloaded into ``into``; None when it holds none."""
    for place in places:
        local = client.download(run_id, place, into)
        if local is not None:
            return local
    return None
