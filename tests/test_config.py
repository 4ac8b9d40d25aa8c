"""Every option of every config group under ``conf/`` composes and instantiates.

Options are discovered from the filesystem, so a new ``conf/<group>/<option>.yaml`` is tested
without editing this file. Configs are composed with ``initialize_config_dir``/``compose`` and
every output (``paths.output_dir``, the MLflow store, MLflow artifacts) goes to ``tmp_path``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from attnseq.data.errors import DataError
from attnseq.errors import ConfigError
from attnseq.model import build_seq2seq
from attnseq.training import build_datamodule, model_config, train, validate

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


GROUP_OPTIONS = [(group, option) for group in GROUPS for option in options(group)]

# Small enough that building the data takes milliseconds; overrides beat every group file.
TINY = [
    "dataset.train_size=8",
    "dataset.val_size=4",
    "dataset.test_size=4",
    "dataset.batch_size=4",
]

# Scorers that compare query and key by a dot product: they need d_q == d_k (scorer/*.yaml).
SAME_SIZE_SCORERS = {"dot", "scaled_dot"}

WORDS = "the cat sees a black dog and my red bird likes this fast mouse".split()


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The models here are tiny: a second intra-op thread only adds contention on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A 40-pair TSV whose source lengths run from 1 to 10 words."""
    lines = []
    for i in range(40):
        src = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(1 + i % 10))
        lines.append(f"{src}\t{src.upper()} x{i % 7}")
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def outputs(tmp_path: Path) -> list[str]:
    """``paths.output_dir`` needs a Hydra runtime (``${hydra:runtime.output_dir}``); the default
    tracking URI is ``./mlflow.db``. Both go to ``tmp_path`` instead."""
    return [f"paths.output_dir={tmp_path / 'out'}", f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]


def compose_train(overrides: list[str], **kwargs) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=overrides, **kwargs)


def option_overrides(group: str, option: str, corpus: Path) -> list[str]:
    overrides = [f"{group}={option}"]
    if (group, option) == ("dataset", "tsv"):
        overrides.append(f"dataset.path={corpus}")
    return overrides


# ---- 1. every option of every group --------------------------------------------------------


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_option_composes_and_instantiates(group, option, corpus, tmp_path):
    cfg = compose_train(option_overrides(group, option, corpus) + outputs(tmp_path) + TINY)

    validate(cfg)
    datamodule = build_datamodule(cfg)
    datamodule.setup()
    assert datamodule.train_examples and datamodule.val_examples and datamodule.test_examples
    model = build_seq2seq(model_config(cfg, len(datamodule.src_vocab), len(datamodule.tgt_vocab)))
    optimizer = instantiate(cfg.optimizer)(model.parameters())
    assert isinstance(optimizer, torch.optim.Optimizer)

    # The data and the model fit together: one training step on a real batch.
    batch = next(iter(datamodule.train_dataloader()))
    logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
    assert logits.shape == (*batch.tgt_out.shape, len(datamodule.tgt_vocab))
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten()).backward()
    optimizer.step()

    trainer_args = OmegaConf.to_container(cfg.trainer, resolve=True)
    extra = dict(logger=False, enable_checkpointing=False, default_root_dir=str(tmp_path))
    if trainer_args["accelerator"] == "gpu" and not torch.cuda.is_available():
        # trainer=gpu is only composed here: Lightning refuses accelerator="gpu" on a machine
        # without CUDA ("No supported gpu backend found!") while building the Trainer, before
        # anything runs. Everything else above (data, model, optimizer) was still instantiated.
        # trainer=ddp (accelerator=cpu, devices=2, strategy=ddp) does build: the processes are
        # only launched by fit(), which this test does not call.
        with pytest.raises(MisconfigurationException, match="No supported gpu backend"):
            L.Trainer(**trainer_args, **extra)
        return
    trainer = L.Trainer(**trainer_args, **extra)
    assert trainer.num_devices == trainer_args["devices"]


def test_hparams_search_optuna_sweeper_instantiates(tmp_path):
    """``hparams_search=optuna`` is a ``_global_`` file that overrides ``hydra/sweeper``: the
    sweeper itself instantiates, its search space names real keys, and every point of the
    ``choice`` grid is a valid model (a sweep must not waste trials on a ConfigError)."""
    cfg = compose_train(["hparams_search=optuna", *outputs(tmp_path)], return_hydra_config=True)
    assert cfg.hydra.runtime.choices["hydra/sweeper"] == "optuna"
    sweeper = instantiate(cfg.hydra.sweeper)
    assert type(sweeper).__name__ == "OptunaSweeper"

    params = dict(cfg.hydra.sweeper.params)
    missing = object()
    assert [key for key in params if OmegaConf.select(cfg, key, default=missing) is missing] == []

    parsed = OverridesParser.create().parse_overrides([f"{key}={value}" for key, value in params.items()])
    grid = {o.get_key_element(): list(o.sweep_iterator()) for o in parsed if o.is_discrete_sweep()}
    assert grid, "the search space has no choice() to check"
    invalid = []
    for point in itertools.product(*grid.values()):
        overrides = dict(zip(grid, point, strict=True))
        trial = cfg.copy()
        for key, value in overrides.items():
            OmegaConf.update(trial, key, value)
        try:
            model_config(trial, src_vocab_size=1, tgt_vocab_size=1).validate()
        except ConfigError as error:
            invalid.append((overrides, str(error)))
    assert invalid == []


# ---- 2. scorer × encoder × decoder -------------------------------------------------------------

COMBOS = list(itertools.product(options("scorer"), options("encoder"), options("decoder")))


def keys_wider_than_query(encoder: str) -> bool:
    """From the encoder's own file: a bidirectional encoder's keys are 2 × hidden_size wide."""
    return bool(OmegaConf.load(CONF_DIR / "encoder" / f"{encoder}.yaml").bidirectional)


@pytest.mark.parametrize(
    ("scorer", "encoder", "decoder"), COMBOS, ids=[f"scorer={s}-encoder={e}-decoder={d}" for s, e, d in COMBOS]
)
def test_scorer_encoder_decoder(scorer, encoder, decoder, tmp_path):
    cfg = compose_train([f"scorer={scorer}", f"encoder={encoder}", f"decoder={decoder}", *outputs(tmp_path)])
    hidden = cfg.model.hidden_size
    if scorer in SAME_SIZE_SCORERS and keys_wider_than_query(encoder):
        with pytest.raises(ConfigError) as caught:
            validate(cfg)
        message = str(caught.value)
        assert f"scorer={scorer}" in message
        assert f"d_q={hidden}" in message and f"d_k={2 * hidden}" in message
        assert "scorer=general" in caught.value.fix and "encoder=gru" in caught.value.fix
        return

    validate(cfg)
    model = build_seq2seq(model_config(cfg, src_vocab_size=12, tgt_vocab_size=9))
    # Forward passes of every valid combination are tested in test_model.py; here: it built
    # what the config names, with keys as wide as the encoder's file says.
    if scorer == "none":
        assert model.attention is None
    else:
        assert model.attention.name == scorer
        assert model.attention.query_dim == hidden
        assert model.attention.key_dim == hidden * (2 if keys_wider_than_query(encoder) else 1)
        assert model.attention.heads == cfg.model.heads


# ---- 3. bad values: validate(cfg) names the value and the fix -----------------------------------
#
# Exception types raised today (all are ValueError subclasses, which is what is asserted):
#   model.*                  -> attnseq.errors.ConfigError
#   dataset.* numbers/ranges -> ValueError (from Seq2SeqDataModule.__init__)
#   dataset=tsv, bad path    -> attnseq.data.errors.DataError

MISSING_TSV = "no/such/dir/missing.tsv"  # placed under tmp_path by the test

BAD_VALUES = [
    pytest.param(["model.heads=3"], ConfigError,
                 ["model.heads=3", "d_k=128", "Fix: set model.heads to one of [1, 2, 4, 8"], id="model.heads=3"),
    pytest.param(["model.hidden_size=0"], ConfigError,
                 ["model.hidden_size=0", "Fix: set model.hidden_size to a whole number"], id="model.hidden_size=0"),
    pytest.param(["dataset.batch_size=0"], ValueError,
                 ["batch_size must be an int >= 1, got 0", "set batch_size to a whole number >= 1"],
                 id="dataset.batch_size=0"),
    pytest.param(["dataset.train_lengths=[5,2]"], ValueError,
                 ["train_lengths=[5, 2]", "lo > hi", "train_lengths=[2, 5]"], id="dataset.train_lengths=[5,2]"),
    pytest.param(["dataset.eval_lengths=[0,10]"], ValueError,
                 ["eval_lengths=[0, 10]", "below 1", "eval_lengths=[1, 10]"], id="dataset.eval_lengths=[0,10]"),
    pytest.param(["dataset.bucket_width=0"], ValueError,
                 ["bucket_width must be an int >= 1, got 0", "set bucket_width to a whole number >= 1"],
                 id="dataset.bucket_width=0"),
    pytest.param(["dataset=tsv", f"dataset.path={{tmp_path}}/{MISSING_TSV}"], DataError,
                 [f"{{tmp_path}}/{MISSING_TSV}", "file not found", "Fix: check the path"],
                 id="dataset=tsv-missing-file"),
    pytest.param(["dataset=tsv"], ConfigError, ["dataset.path", "not set", "Fix: add it", "dataset.path=/abs/"],
                 id="dataset=tsv-path-not-set"),
]


@pytest.mark.parametrize(("overrides", "raised_today", "expected"), BAD_VALUES)
def test_validate_rejects_bad_value(overrides, raised_today, expected, tmp_path):
    overrides = [o.replace("{tmp_path}", str(tmp_path)) for o in overrides]
    cfg = compose_train(overrides + outputs(tmp_path))
    with pytest.raises(ValueError) as caught:
        validate(cfg)
    assert isinstance(caught.value, raised_today)
    message = str(caught.value)
    for text in expected:
        assert text.replace("{tmp_path}", str(tmp_path)) in message


# ---- 4. train(cfg) end to end ---------------------------------------------------------------------


def test_train_fast_dev_run_finishes_mlflow_run(tmp_path, monkeypatch):
    # MLflow puts a SQLite store's artifacts under ./mlruns: run from tmp_path so they land there.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = compose_train([
        "debug=fdr",
        *outputs(tmp_path),
        "model.embedding_dim=16",
        "model.hidden_size=32",
        "dataset.train_lengths=[1,6]",
        "dataset.eval_lengths=[1,10]",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
    ])

    result = train(cfg)

    assert result is None or isinstance(result, float)
    client = MlflowClient(tracking_uri=cfg.mlflow.tracking_uri)
    experiment = client.get_experiment_by_name(cfg.mlflow.experiment_name)
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["scorer.name"] == "additive"
    assert run.info.artifact_uri.removeprefix("file://").startswith(str(tmp_path))
