"""What a training run is called and tagged: its name from the config's choices, its seed and the time
it started (``copy-gru-additive-bahdanau-h1 seed 0 · 11:09:40``: runs of one config told apart), or in
a sweep from the overrides that vary (``scorer=dot model.heads=4 (#3)``); its overrides, and its place
in a sweep. Importing it registers the config's resolvers
(``attnseq.config.resolvers``: the output folder's unique suffix), for every process that trains."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from attnseq.config import TrainConfig, resolvers  # noqa: F401  (resolvers registers ${attnseq.unique:})
from attnseq.lifecycle.requeue import slurm_job_id
from attnseq.tracking import tags
from attnseq.tracking.redaction import redact_overrides
from attnseq.training.sweep import sweep_context


class RunIdentity(NamedTuple):
    name: str
    tags: dict[str, str]
    parent_run_id: str | None  # the sweep's parent run, when this job belongs to one


def describe_choices(cfg: TrainConfig | DictConfig) -> str:
    """A default run name from the choices users sweep over: ``copy-gru-additive-bahdanau-h1`` (of the
    composed config too: a sweep job rejected by validation is named the same, and has no typed one)."""
    scorer = cfg.scorer.name
    parts = [cfg.dataset.task, cfg.encoder.name, scorer]
    if scorer != "none":
        parts += [cfg.decoder.convention, f"h{cfg.model.heads}"]
        local = getattr(getattr(cfg, "attention", None), "local", "none")  # Luong's local attention, if on
        parts += [f"local-{local}"] if local != "none" else []
    return "-".join(str(p) for p in parts)


def sweep_run_name(task_overrides: Iterable[str], sweep_keys: Iterable[str], job_num: int | None) -> str:
    """A sweep job's name from the overrides that vary across the sweep: ``scorer=dot model.heads=4``."""
    keys = set(sweep_keys)
    varying = [o for o in task_overrides if o.split("=", 1)[0].lstrip("+~") in keys]
    name = " ".join(varying) or "job"
    return f"{name} (#{job_num})" if job_num is not None else name


def single_run_name(choices: str, seed: object, started: datetime) -> str:
    """A run's name outside a sweep: its choices, its seed and the local time it started
    (``copy-gru-additive-bahdanau-h1 seed 0 · 11:09:40``), so that two runs of one config differ in a
    list of runs (the date is in the list's *Created* column)."""
    return f"{choices} seed {seed} · {started:%H:%M:%S}"


def run_identity(cfg: TrainConfig | DictConfig, now: datetime | None = None) -> RunIdentity:
    """The run's name (``mlflow.run_name`` when set), tags and sweep parent; ``now``: when it starts."""
    parent, keys = sweep_context()
    choices = describe_choices(cfg)
    run_tags = {tags.KIND: tags.TRAIN, tags.CHOICES: choices}
    if job := slurm_job_id():  # a requeued job finds its run by it
        run_tags[tags.SLURM_JOB] = job
    name = cfg.mlflow.run_name or single_run_name(choices, cfg.seed, now or datetime.now())
    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        overrides = redact_overrides(hydra.overrides.task)
        run_tags[tags.OVERRIDES] = " ".join(overrides)
        if parent:
            job_num = hydra.job.get("num")
            name = cfg.mlflow.run_name or sweep_run_name(overrides, keys, job_num)
            run_tags.update({tags.SWEEP_ID: parent, tags.JOB_NUM: str(job_num)})
    return RunIdentity(name, run_tags, parent)
