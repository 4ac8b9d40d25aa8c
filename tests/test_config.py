"""Every option of every config group under ``conf/`` composes and instantiates.

Options are discovered from the filesystem, so a new ``conf/<group>/<option>.yaml`` is tested
without editing this file. Configs are composed with ``initialize_config_dir``/``compose`` and
every output (``paths.output_dir``, the MLflow store, MLflow artifacts) goes to ``tmp_path``.
"""

from __future__ import annotations

import inspect
import itertools
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from attnseq.attention import NO_ATTENTION, SCORERS
from attnseq.config import validate_train
from attnseq.data.errors import DataError
from attnseq.errors import ConfigError
from attnseq.model import build_seq2seq
from attnseq.model.conventions import decoder_convention
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


def needs_same_size(scorer: str) -> bool:
    """From the scorer's class: it compares query and key directly, so d_q must equal d_k."""
    return scorer != NO_ATTENTION and SCORERS[scorer].same_size

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


def outputs(tmp_path: Path, own_store: bool = False) -> list[str]:
    """``paths.output_dir`` needs a Hydra runtime (``${hydra:runtime.output_dir}``); it goes to
    ``tmp_path``. The default tracking URI is ``./mlflow.db``: the tests that only check a config
    share one store beside their ``tmp_path`` folders (``validate`` creates a store it is given, and
    a fresh SQLite schema costs a second or two); a test that reads the store gets its own."""
    store = tmp_path / "mlflow.db" if own_store else tmp_path.parent / "checked-configs-mlflow.db"
    return [f"paths.output_dir={tmp_path / 'out'}", f"mlflow.tracking_uri=sqlite:///{store}"]


def compose_train(overrides: list[str], **kwargs) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=overrides, **kwargs)


def option_overrides(group: str, option: str, corpus: Path) -> list[str]:
    """The option, and the test corpus for any option that reads a TSV corpus (``dataset=tsv``, and
    presets such as ``experiment=messages_en_fr`` whose corpus a command builds first)."""
    overrides = [f"{group}={option}"]
    if compose_train(overrides).dataset.task == "tsv":
        overrides.append(f"dataset.path={corpus}")
    return overrides


# ---- 1. every option of every group --------------------------------------------------------


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_option_composes_and_instantiates(group, option, corpus, tmp_path):
    cfg = compose_train(option_overrides(group, option, corpus) + outputs(tmp_path) + TINY)

    config = validate(cfg)
    datamodule = build_datamodule(config)
    datamodule.setup()
    assert datamodule.train_examples and datamodule.val_examples and datamodule.test_examples
    model = build_seq2seq(model_config(config, len(datamodule.src_vocab), len(datamodule.tgt_vocab)))
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
    assert cfg.hydra.runtime.choices["hydra/sweeper"] == "study"
    sweeper = instantiate(cfg.hydra.sweeper)
    assert type(sweeper).__name__ == "StudySweeper"

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
            model_config(validate_train(trial), src_vocab_size=1, tgt_vocab_size=1).validate()
        except ConfigError as error:
            invalid.append((overrides, str(error)))
    assert invalid == []


# ---- 2. scorer × encoder × decoder -------------------------------------------------------------


def test_every_registered_scorer_has_its_config_file_with_its_settings():
    """The two places a scorer lives agree: each class in the registry has ``conf/scorer/<name>.yaml``
    (and each file but ``none`` a class), whose keys besides ``name`` are the fields of its settings."""
    assert set(options("scorer")) == {NO_ATTENTION, *SCORERS}
    for name, cls in SCORERS.items():
        group = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "scorer" / f"{name}.yaml"))
        assert group.pop("name") == name
        assert set(group) == set(cls.Settings.model_fields) - {"name"}, name


def test_a_scorer_setting_reaches_the_model(tmp_path):
    for name, cls in SCORERS.items():
        if "attn_dim" in cls.Settings.model_fields:
            cfg = compose_train([f"scorer={name}", "scorer.attn_dim=24", *outputs(tmp_path)])
            model = build_seq2seq(model_config(validate_train(cfg), src_vocab_size=12, tgt_vocab_size=9))
            assert model.attention.attn_dim == 24, name


def test_input_feeding_belongs_to_the_luong_convention(tmp_path):
    cfg = compose_train(["decoder=bahdanau", *outputs(tmp_path)])
    assert "input_feeding" not in cfg.decoder
    assert model_config(validate_train(cfg), src_vocab_size=12, tgt_vocab_size=9).feeds_input is False
    cfg = compose_train(["decoder=bahdanau", "+decoder.input_feeding=true", *outputs(tmp_path)])
    with pytest.raises(ConfigError, match="decoder.input_feeding=true"):
        validate(cfg)


def test_a_plugin_that_cannot_be_imported_names_the_key(tmp_path):
    cfg = compose_train(["plugins=[no_such_module_here]", *outputs(tmp_path)])
    with pytest.raises(ConfigError) as caught:
        validate(cfg)
    assert "plugins" in str(caught.value) and "no_such_module_here" in str(caught.value)
    assert "PYTHONPATH" in caught.value.fix


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
    if needs_same_size(scorer) and keys_wider_than_query(encoder):
        with pytest.raises(ConfigError) as caught:
            validate(cfg)
        message = str(caught.value)
        assert f"scorer={scorer}" in message
        assert f"d_q={hidden}" in message and f"d_k={2 * hidden}" in message
        assert "scorer=general" in caught.value.fix and "encoder=gru" in caught.value.fix
        return
    if scorer == "none" and decoder_convention(cfg.decoder.convention).needs_attention:  # e.g. decoder=transformer
        with pytest.raises(ConfigError) as caught:
            validate(cfg)
        assert "scorer=none" in str(caught.value) and f"decoder={decoder}" in str(caught.value)
        return

    model = build_seq2seq(model_config(validate(cfg), src_vocab_size=12, tgt_vocab_size=9))
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
# Exception types raised (all are ValueError subclasses, which is what is asserted):
#   a key's own value        -> attnseq.errors.ConfigError (the schema, attnseq.training.validation)
#   model sizes together     -> attnseq.errors.ConfigError (ModelConfig.validate)
#   dataset=tsv, bad path    -> attnseq.data.errors.DataError

MISSING_TSV = "no/such/dir/missing.tsv"  # placed under tmp_path by the test

BAD_VALUES = [
    pytest.param(["model.heads=3"], ConfigError,
                 ["model.heads=3", "d_k=128", "Fix: set model.heads to one of [1, 2, 4, 8"], id="model.heads=3"),
    pytest.param(["model.hidden_size=0"], ConfigError,
                 ["model.hidden_size=0", "Fix: set model.hidden_size to a whole number"], id="model.hidden_size=0"),
    pytest.param(["dataset.batch_size=0"], ConfigError,
                 ["dataset.batch_size=0 must be a whole number ≥ 1", "Fix: set dataset.batch_size to a whole number"],
                 id="dataset.batch_size=0"),
    pytest.param(["dataset.train_lengths=[5,2]"], ConfigError,
                 ["dataset.train_lengths=[5,2]", "1 ≤ lo ≤ hi", "dataset.train_lengths=[2,5]"],
                 id="dataset.train_lengths=[5,2]"),
    pytest.param(["dataset.eval_lengths=[0,10]"], ConfigError,
                 ["dataset.eval_lengths=[0,10]", "1 ≤ lo ≤ hi", "dataset.eval_lengths=[1,10]"],
                 id="dataset.eval_lengths=[0,10]"),
    pytest.param(["dataset.bucket_width=0"], ConfigError,
                 ["dataset.bucket_width=0 must be a whole number ≥ 1", "Fix: set dataset.bucket_width to a whole"],
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
        *outputs(tmp_path, own_store=True),
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


# ---- 5. shared bases: trainer/base, dataset/base, the bottleneck sweep ------------------------
#
# cpu/gpu/ddp extend conf/trainer/base/common.yaml and copy/reverse/sort extend
# conf/dataset/base/symbols.yaml. The values below are what each option composed to when every
# file still spelled out all of its keys: the bases must change nothing.

def own_keys(path: Path) -> dict:
    """A config file's own keys: what it sets besides its defaults list."""
    return {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k != "defaults"}


@pytest.mark.parametrize("trainer", options("trainer"))
def test_trainer_option_composes_to_the_shared_arguments_and_its_own(trainer, tmp_path):
    """Each trainer option is ``base/common.yaml`` with the option's own keys on top, every one of
    them set (nothing left ``???``), and all of them arguments ``lightning.Trainer`` takes."""
    cfg = compose_train([f"trainer={trainer}", *outputs(tmp_path)])
    composed = OmegaConf.to_container(cfg.trainer, resolve=True)
    shared = own_keys(CONF_DIR / "trainer" / "base" / "common.yaml")
    assert composed == {**shared, **own_keys(CONF_DIR / "trainer" / f"{trainer}.yaml")}
    assert not OmegaConf.missing_keys(cfg.trainer)
    inspect.signature(L.Trainer.__init__).bind(None, **composed)


def test_trainer_cpu_is_the_default(tmp_path):
    cfg = compose_train(outputs(tmp_path), return_hydra_config=True)
    assert cfg.hydra.runtime.choices.trainer == "cpu"
    assert cfg.trainer == compose_train(["trainer=cpu", *outputs(tmp_path)]).trainer


@pytest.mark.parametrize("task", [t for t in options("dataset") if "base/symbols@_here_" in
                                  (CONF_DIR / "dataset" / f"{t}.yaml").read_text()])
def test_symbol_task_composes_to_the_shared_dataset_with_its_own_task(task, tmp_path):
    """A symbol task's file names the task and takes every other key from ``base/symbols.yaml``,
    in its order (``task`` first); the composed group is what the task's settings accept."""
    cfg = compose_train([f"dataset={task}", *outputs(tmp_path)])
    dataset = OmegaConf.to_container(cfg.dataset, resolve=True)
    shared = own_keys(CONF_DIR / "dataset" / "base" / "symbols.yaml")
    assert list(dataset) == list(shared) and list(dataset)[0] == "task"
    assert dataset == {**shared, "task": task}
    assert validate_train(cfg).dataset.task == task


@pytest.mark.parametrize("group", ["trainer", "dataset"])
def test_a_base_is_not_offered_as_an_option(group):
    """Hydra's list of options for ``<group>=`` (what ``--help`` and shell completion show)
    holds the files of the group itself; the base sits in the subgroup ``<group>/base``."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        offered = loader.get_group_options(group)
        bases = loader.get_group_options(f"{group}/base")
    assert offered == options(group)
    assert bases and not set(bases) & set(offered)


def test_bottleneck_sweeps_every_scorer_option_none_included(tmp_path):
    """The preset's sweep reads conf/scorer/ (``glob(*)``): a new scorer file joins the experiment."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=bottleneck", *outputs(tmp_path)], return_hydra_config=True)
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        (sweep,) = parser.parse_overrides([f"scorer={cfg.hydra.sweeper.params.scorer}"])
        swept = list(sweep.sweep_string_iterator())
    assert sorted(swept) == options("scorer")
    assert "none" in swept


def test_bottleneck_sweeps_three_seeds_per_scorer(tmp_path):
    """Three seeds per option: the comparison reports a mean and a 95% interval per bucket."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=bottleneck", *outputs(tmp_path)], return_hydra_config=True)
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        (sweep,) = parser.parse_overrides([f"seed={cfg.hydra.sweeper.params.seed}"])
        seeds = [int(s) for s in sweep.sweep_string_iterator()]
    assert seeds == [0, 1, 2]
