"""Every config key is checked before anything is created: one message per bad value naming the
key, what it must be and the fix (``validate(cfg)`` on composed configs, in-process), and through
the real CLIs exit code 2, no traceback and no MLflow store; Hydra's own config errors likewise."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import lightning as L
import pytest
import torch
from cli_helpers import EVALUATE_PY, explain, outputs_under, run_cli, user_env  # noqa: E402  (tests/ on sys.path)
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from pydantic import Field, TypeAdapter

from attnseq.cli import as_config_error, known_keys
from attnseq.config import validate as stage_one
from attnseq.config import validate_evaluate, validate_train
from attnseq.config.memory import MemoryBudget, check_memory, length_need
from attnseq.config.validate import logged_metrics
from attnseq.data.errors import DataError
from attnseq.errors import ConfigError
from attnseq.evaluation import evaluate
from attnseq.metrics.declarations import SCORES
from attnseq.problems import allowed, describe, schema_of
from attnseq.training import build_datamodule, build_module, validate
from attnseq.training.validation import arguments, bound

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
GiB = 2**30


def compose_config(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(name, overrides=overrides)


def outputs(tmp_path: Path) -> list[str]:
    return [f"paths.output_dir={tmp_path / 'out'}", f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]


@pytest.fixture
def sixteen_gib(monkeypatch):
    """The memory check compares with this machine's memory: fix it, so the verdicts do not depend on it."""
    monkeypatch.setattr(stage_one, "memory_budget", lambda cfg: MemoryBudget(host=16 * GiB))


# ---- the cases: rejected by validate(cfg), each naming its key and the fix ---------------

BAD = [
    # (overrides, fragments of the problem, fragments of the fix)
    (["model.dropout=abc"], ["model.dropout=abc", "a number in [0, 1)"], ["model.dropout=0.1"]),
    (["model.dropout=null"], ["model.dropout=null", "a number in [0, 1)"], ["model.dropout=0.1"]),
    (["threads=-1"], ["threads=-1", "a whole number in [1, 1024], or null"], ["threads=1"]),
    (["training.teacher_forcing=abc"], ["training.teacher_forcing=abc", "[0, 1]"], ["training.teacher_forcing=1.0"]),
    (["+trainer.foo=1"], ["trainer.foo is not an argument of lightning.Trainer"], ["~trainer.foo", "max_epochs"]),
    (["decode.max_length_ratio=-1"], ["decode.max_length_ratio=-1", "(0, 10]"], ["decode.max_length_ratio=1.5"]),
    (["checkpoint.monitor=val/exact_matc"], ["val/exact_matc", "not a metric", "Did you mean val/exact_match?"],
     ["val/loss", "val/acc_best", "val/acc_len/01-05", "checkpoint.monitor=val/exact_match"]),
    (["mlflow.experiment_name=''"], ["mlflow.experiment_name=''", "non-empty"], ["mlflow.experiment_name=attnseq"]),
    (["optimizer._target_=torch.optim.Adamm"],
     ["torch.optim.Adamm cannot be imported", "Did you mean torch.optim.Adam?"],
     ["optimizer._target_=torch.optim.Adam", "SGD"]),
    (["optimizer.lr=inf"], ["optimizer.lr=inf", "a number in (0, 10]"], ["optimizer.lr=0.003"]),
    (["scheduler.gamma=-1"], ["scheduler.gamma=-1", "> 0"], ["scheduler.gamma=0.6"]),
    (["trainer.max_epochs=0"], ["trainer.max_epochs=0", "≥ 1"], ["trainer.max_epochs=5"]),
    (["dataset.train_lengths=[1,100000]"], ["dataset.train_lengths=[1,100000]", "TB of memory", "17.2 GB"],
     ["dataset.train_lengths=[1,"]),
    # the data module's checks named the value, but the fix always said dataset.batch_size=64
    (["dataset.bucket_width=0"], ["dataset.bucket_width=0"], ["dataset.bucket_width=5"]),
    (["dataset.num_workers=-1"], ["dataset.num_workers=-1", "[0, 64]"], ["dataset.num_workers=0"]),
    (["dataset.bucket_pool=0"], ["dataset.bucket_pool=0", "[1, 100000]"], ["dataset.bucket_pool="]),
    (["dataset.train_size=abc"], ["dataset.train_size=abc"], ["dataset.train_size=12800"]),
    (["dataset.eval_lengths=[10,5]"], ["dataset.eval_lengths=[10,5]", "1 ≤ lo ≤ hi"],
     ["dataset.eval_lengths=[5,10]"]),
    (["dataset.batch_type=tokens"], ["dataset.batch_type=tokens", "sentence", "token"], ["dataset.batch_type="]),
    (["dataset.batch_type=token", "dataset.length_bucketing=false"], ["dataset.batch_type=token", "length_bucketing"],
     ["dataset.length_bucketing=true", "dataset.batch_type=sentence"]),
    # more of the same kinds
    (["+trainer.logger=false"], ["trainer.logger is set by attnseq"], ["~trainer.logger"]),
    (["trainer.enable_progress_bar=maybe"], ["trainer.enable_progress_bar=maybe", "true or false, or null"],
     ["trainer.enable_progress_bar"]),
    (["+trainer.precision=17"], ["trainer.precision=17", "one of 64, 32, 16"], ["trainer.precision"]),
    (["+optimizer.momentum=0.9"], ["optimizer.momentum is not an argument of torch.optim.Adam"], ["betas", "lr"]),
    (["optimizer._target_=torch.optim.lr_scheduler.StepLR"], ["is not an optimizer class"],
     ["optimizer._target_=torch.optim."]),
    (["scheduler._target_=torch.optim.lr_scheduler.ExponentialLRR"],
     ["Did you mean torch.optim.lr_scheduler.ExponentialLR?"],
     ["scheduler._target_=torch.optim.lr_scheduler.ExponentialLR"]),
    (["scheduler._target_=torch.optim.lr_scheduler.LinearLR", "~scheduler.gamma", "+scheduler.end_factor=0.0",
      "+scheduler.total_iters=2"], ["the learning rate in epoch 2 would be 0.0", "LinearLR"], ["scheduler=null"]),
    (["training.label_smoothing=1"], ["training.label_smoothing=1", "[0, 1)"], ["training.label_smoothing=0.1"]),
    (["lr_schedule=noam", "scheduler.warmup=0"], ["scheduler.warmup=0", "whole number in [1, "],
     ["set scheduler.warmup to a whole number in [1, "]),  # the range is Noam's signature's (Annotated)
    (["lr_schedule=noam", "+scheduler.gamma=0.5"],
     ["scheduler.gamma is not an argument of attnseq.training.schedules.Noam"], ["~scheduler.gamma", "model_size"]),
    (["scheduler._target_=torch.optim.lr_scheduler.LinearLR", "~scheduler.gamma", "+scheduler.end_factor=0.0",
      "+scheduler.total_iters=2", "scheduler.interval=step"], ["the learning rate at optimizer step 3 would be 0.0"],
     ["scheduler=null"]),
    (["scheduler.interval=batch"], ["scheduler.interval=batch", "one of epoch, step"], ["scheduler.interval=epoch"]),
    (["trainer.accumulate_grad_batches=0"], ["trainer.accumulate_grad_batches=0", "[1, 10000]"],
     ["trainer.accumulate_grad_batches=2"]),
    (["checkpoint.monitor=val/loss"], ["checkpoint.mode=max", "val/loss is better when lower"],
     ["checkpoint.mode=min"]),
    (["optimized_metric=val/acc_bets"], ["optimized_metric=val/acc_bets", "Did you mean val/acc_best?"],
     ["optimized_metric=val/acc_best"]),
    (["seed=-3"], ["seed=-3"], ["seed=0"]),
    (["+model.dropuot=0.1"], ["model.dropuot", "Did you mean model.dropout?"], ["model.dropout=<value>"]),
    (["encoder.cell=rnn"], ["encoder.cell=rnn", "one of gru, lstm"], ["encoder.cell=gru"]),
    (["model=big"], ["model=big replaces the whole model group"], ["model.<key>=<value>"]),
    (["~model.dropout"], ["model.dropout is missing"], ["model.dropout=0.1"]),
    (["tracking.heatmap_every_n_epochs=0"], ["tracking.heatmap_every_n_epochs=0"],
     ["tracking.heatmap_every_n_epochs=1"]),
    (["training.test_after_fit=yes"], ["training.test_after_fit=yes", "true or false"], ["training.test_after_fit"]),
    (["encoder=transformer", "encoder.heads=5"], ["encoder.heads=5 does not divide model.hidden_size=128"],
     ["encoder.heads to one of [1, 2, 4, 8", "encoder.heads=128"]),
    (["encoder=transformer", "encoder.ff_dim=0"], ["encoder.ff_dim=0", "≥ 1"], ["encoder.ff_dim=256"]),
    (["encoder=transformer", "encoder.layers=0"], ["encoder.layers=0", "≥ 1"], ["encoder.layers=2"]),
    (["encoder=transformer", "encoder.bidirectional=true"], ["encoder.bidirectional=true with encoder=transformer"],
     ["drop encoder.bidirectional"]),
    (["encoder=transformer", "encoder.kind=mamba"], ["encoder.kind=mamba"], ["rnn, transformer", "encoder.kind=rnn"]),
    (["encoder=gru", "+encoder.heads=4"], ["encoder.heads is not a setting"], ["~encoder.heads"]),
    (["encoder=transformer", "+encoder.head=2"], ["encoder.head is not a setting", "Did you mean encoder.heads?"],
     ["~encoder.head"]),
    (["scorer.name=dott"], ["scorer.name=dott", "Did you mean scorer.name=dot?"], ["scorer.name=dot"]),
    (["dataset.task=copyy"], ["dataset.task=copyy"], ["dataset.task=copy"]),
    (["dataset=translate", "+dataset.num_symbols=3"], ["dataset.num_symbols is not a setting"],
     ["~dataset.num_symbols"]),
    (["decoder=bahdanau", "+decoder.input_feeding=true"], ["decoder.input_feeding=true", "decoder=luong"],
     ["decoder.input_feeding=null"]),
    (["dataset=tsv"], ["dataset.path"], ["dataset.path=/abs/path/pairs.tsv"]),
    (["model.heads=3"], ["model.heads=3 does not divide"], ["model.heads=128"]),
    (["model.tie_output=maybe"], ["model.tie_output=maybe", "true or false"], ["model.tie_output"]),
    (["dataset=translate", "model.share_embeddings=true"], ["model.share_embeddings=true", "dataset=translate"],
     ["model.share_embeddings=false", "dataset=copy"]),
    (["dataset=translate", "training.val_text_scores=[sacrebleu,ter]", "checkpoint.monitor=val/ter"],
     ["checkpoint.mode=max", "val/ter is better when lower"], ["checkpoint.mode=min"]),
    (["dataset=translate", "checkpoint.monitor=val/ter", "checkpoint.mode=min"],
     ["checkpoint.monitor=val/ter", "training.val_text_scores=[sacrebleu,chrf]"],
     ["training.val_text_scores=[sacrebleu,chrf,ter]"]),
    (["scorer=dot", "encoder=bigru"], ["scorer=dot", "d_k=256"], ["scorer=general"]),
    (["scorer=multihead", "model.heads=4", "scorer.model_dim=6"],
     ["scorer.model_dim=6 must be a positive multiple of model.heads=4"], ["multiple of 4", "leave it null"]),
    (["average.k=0"], ["average.k=0", "[1, 100]"], ["average.k=5"]),
    (["faith.samples=-1"], ["faith.samples=-1", "[0, 100000]"], ["faith.samples=0"]),
    (["faith.measures=[gradient]"], ["faith.measures=[gradient]", "leave_one_out"], ["faith.measures=["]),
    (["faith.adversarial.epsilon=2"], ["faith.adversarial.epsilon=2", "(0.0, 1.0]"],
     ["faith.adversarial.epsilon=0.01"]),
    (["faith.samples=4", "checkpoint.monitor=val/faith/adversarial_jsd"],
     ["checkpoint.mode=max", "val/faith/adversarial_jsd is better when lower"], ["checkpoint.mode=min"]),
    (["average.of=worst"], ["average.of=worst", "last, best"], ["average.of=last"]),
    (["average.k=6", "trainer.max_epochs=5"], ["average.k=6 is more than the 5 checkpoints", "trainer.max_epochs=5"],
     ["average.k=5", "trainer.max_epochs=6"]),
    (["average.k=3", "trainer.max_epochs=5", "+trainer.check_val_every_n_epoch=2"],
     ["average.k=3 is more than the 2 checkpoints"], ["average.k=2", "trainer.max_epochs=6"]),
    (["average.k=2", "+trainer.limit_val_batches=0"], ["average.k=2", "limit_val_batches=0"],
     ["average.k=null"]),
    (["+trainer.check_val_every_n_epoch=null"],  # Lightning would refuse a fraction of an epoch at fit time
     ["trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=1.0"], ["trainer.val_check_interval=2000"]),
    (["+trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=0.5"], ["trainer.val_check_interval=0.5"],
     ["~trainer.check_val_every_n_epoch"]),
]


@pytest.mark.parametrize(("overrides", "problem", "fix"), BAD, ids=[" ".join(case[0]) for case in BAD])
def test_validate_names_the_key_what_it_must_be_and_the_fix(overrides, problem, fix, tmp_path, sixteen_gib):
    cfg = compose_config("train", overrides + outputs(tmp_path))
    with pytest.raises(ConfigError) as caught:
        validate(cfg)
    for fragment in problem:
        assert fragment in caught.value.problem, caught.value
    for fragment in fix:
        assert fragment in caught.value.fix, caught.value
    assert list(tmp_path.iterdir()) == []  # nothing created: no store, no output folder


@pytest.mark.parametrize(("overrides", "handed_on"), [
    ([], {}),                                                                          # Lightning's own default, 1
    (["+trainer.check_val_every_n_epoch=2"], {"check_val_every_n_epoch": 2}),
    (["+trainer.check_val_every_n_epoch=null", "trainer.val_check_interval=100"],    # batches over the whole run
     {"check_val_every_n_epoch": None}),
])
def test_a_null_check_val_every_n_epoch_reaches_lightning_as_its_own_choice(overrides, handed_on, tmp_path):
    config = validate_train(compose_config("train", [*overrides, *outputs(tmp_path)]))
    given = arguments(config.trainer)
    assert {k: given[k] for k in given if k == "check_val_every_n_epoch"} == handed_on
    trainer = L.Trainer(**{**given, "logger": False, "default_root_dir": str(tmp_path)})
    assert trainer.check_val_every_n_epoch == handed_on.get("check_val_every_n_epoch", 1)


def test_a_directory_as_the_tsv_path_must_hold_the_split_files(tmp_path):
    cfg = compose_config("train", ["dataset=tsv", f"dataset.path={tmp_path}", *outputs(tmp_path)])
    with pytest.raises(DataError, match="a corpus folder holds train.tsv, val.tsv, test.tsv") as caught:
        validate(cfg)
    assert caught.value.path == str(tmp_path / "train.tsv") and "dataset.path" in caught.value.fix


def test_a_value_that_cannot_be_resolved_names_its_key(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNSEQ_TEST_UNSET", raising=False)
    cfg = compose_config("train", [*outputs(tmp_path), "mlflow.tracking_uri=${oc.env:ATTNSEQ_TEST_UNSET}"])
    with pytest.raises(ConfigError, match=r"mlflow.tracking_uri=\$\{oc.env:ATTNSEQ_TEST_UNSET\} cannot be resolved"):
        validate(cfg)


def test_the_default_config_and_every_learning_rate_schedule_step_are_accepted(tmp_path, sixteen_gib):
    validate(compose_config("train", outputs(tmp_path)))
    validate(compose_config("train", ["scheduler=null", "trainer.max_epochs=50", *outputs(tmp_path)]))
    for schedule in ("constant", "noam", "inverse_sqrt"):
        validate(compose_config("train", [f"lr_schedule={schedule}", "training.label_smoothing=0.1",
                                          *outputs(tmp_path)]))
    validate(compose_config("train", ["+trainer.max_time=00:00:10:00", "+db_password=x", "+tracking.api_token=x",
                                      *outputs(tmp_path)]))


@pytest.mark.parametrize("overrides, optimizer, weight_decay", [
    ([], "Adam", 0.0),                                                      # conf/train.yaml's 0
    (["optimizer._target_=torch.optim.AdamW"], "AdamW", 0.0),
    (["optimizer._target_=torch.optim.AdamW", "optimizer.weight_decay=null"], "AdamW", 0.01),  # AdamW's own
    (["optimizer.weight_decay=0.25"], "Adam", 0.25),
])
def test_the_optimizer_gets_the_weight_decay_set_or_at_null_its_own(overrides, optimizer, weight_decay, tmp_path):
    small = ["dataset.train_size=32", "dataset.val_size=16", "model.hidden_size=8", "model.embedding_dim=8"]
    config = validate_train(compose_config("train", [*overrides, *small, *outputs(tmp_path)]))
    datamodule = build_datamodule(config)
    datamodule.setup()
    built = build_module(config, datamodule).optimizer_factory([torch.nn.Parameter(torch.zeros(1))])
    assert type(built).__name__ == optimizer
    assert built.param_groups[0]["weight_decay"] == weight_decay
    assert built.param_groups[0]["lr"] == config.optimizer.lr


def test_every_problem_is_reported_at_once_each_with_its_key_and_fix(tmp_path):
    cfg = compose_config("train", ["model.heads=-1", "model.dropout=2", "seed=x", "trainer.max_epochs=0",
                                   "checkpoint.monitor=val/exact_matc", *outputs(tmp_path)])
    with pytest.raises(ConfigError) as caught:
        validate_train(cfg)
    problems = caught.value.problems
    keys = {p.problem.split("=")[0] for p in problems}  # the monitored metric too: what it needs is sound
    assert keys == {"model.heads", "model.dropout", "seed", "trainer.max_epochs", "checkpoint.monitor"}
    for p in problems:
        key, value = p.problem.split(" ")[0].split("=")
        assert f"{key}=" in p.fix and value != ""
    assert str(caught.value).count("Fix:") == 5


def test_stage_one_answers_without_importing_torch_lightning_or_mlflow(tmp_path):
    """A typo or a bad value is answered before the heavy libraries load, a monitored metric's too."""
    script = f"""
import sys
from hydra import compose, initialize_config_dir
from attnseq.config import validate_train
from attnseq.errors import ConfigError
with initialize_config_dir(config_dir={str(CONF_DIR)!r}, version_base="1.3"):
    good = compose("train", overrides=["encoder=transformer", "scorer=multihead", "dataset=translate"])
    bad = compose("train", overrides=["model.heads=-1"])
    monitor = compose("train", overrides=["checkpoint.monitor=val/exact_matc"])
validate_train(good)
for cfg in (bad, monitor):
    try:
        validate_train(cfg)
    except ConfigError as error:
        print(error)
print(sorted(m for m in ("torch", "lightning", "mlflow") if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=CONF_DIR.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "model.heads=-1" in proc.stdout and "model.heads=1" in proc.stdout
    assert "checkpoint.monitor=val/exact_matc" in proc.stdout and "checkpoint.monitor=val/exact_match" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def every_option_override() -> list[list[str]]:
    groups = ["dataset", "encoder", "scorer", "decoder", "trainer", "experiment", "debug", "hparams_search"]
    return [[f"{group}={path.stem}"] for group in groups for path in sorted((CONF_DIR / group).glob("*.yaml"))]


def undeclared(model) -> set[str]:
    """Keys a validated model holds that no field declares (accepted as added with ``+``)."""
    from pydantic import BaseModel

    from attnseq.config.models import HANDED_ON

    found = set(model.model_extra or ())
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel) and not isinstance(value, HANDED_ON):
            found |= {f"{name}.{key}" for key in undeclared(value)}
    return found


def test_every_key_of_train_yaml_and_every_group_option_is_a_declared_field(tmp_path):
    """No yaml key is only accepted as an added one: each has its type, range and meaning (the groups
    handed on, ``trainer.*`` and ``scheduler.*``, are checked against their callable's signature instead)."""
    for overrides in [[], *every_option_override()]:
        extra = [f"dataset.path={tmp_path}/x.tsv"] if "dataset=tsv" in overrides else []
        cfg = compose_config("train", overrides + extra + outputs(tmp_path))
        if "dataset.path" in str(cfg.dataset) and "hydra:runtime" in str(cfg.dataset.get("path", "")):
            continue
        assert undeclared(validate_train(cfg)) == set(), overrides


def test_every_key_of_evaluate_yaml_is_a_declared_field(tmp_path):
    assert undeclared(validate_evaluate(compose_config("evaluate", [f"paths.output_dir={tmp_path}"]))) == set()


TEXT_SCORES_LOGGED = [([], set()), (["dataset=translate"], {"val/sacrebleu", "val/chrf"}),
                      (["dataset=translate", "training.val_text_scores=[ter]"], {"val/ter"})]


@pytest.mark.parametrize(("task", "text_scores"), TEXT_SCORES_LOGGED, ids=["copy", "translate", "translate-ter"])
def test_the_metrics_the_monitor_may_name_are_exactly_those_the_module_logs(tmp_path, task, text_scores):
    """``logged_metrics`` (what checkpoint.monitor and optimized_metric are checked against) against
    what one real epoch of fit logs, for a model with attention on a task with a gold alignment, and
    on one whose outputs are sentences (sacreBLEU and chrF by default, the scores asked for otherwise)."""
    cfg = compose_config("train", [
        *task, "dataset.train_size=32", "dataset.val_size=64", "dataset.batch_size=16", "dataset.train_lengths=[1,6]",
        "dataset.eval_lengths=[1,10]", "model.hidden_size=8", "model.embedding_dim=8", *outputs(tmp_path),
    ])
    config = validate_train(cfg)
    datamodule = build_datamodule(config)
    datamodule.setup()
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    trainer.fit(build_module(config, datamodule), datamodule=datamodule)
    logged = set(trainer.callback_metrics) - {"train/loss_step"}
    assert logged == set(logged_metrics(config))
    assert {name for name in logged if name.startswith("val/") and name[4:] in SCORES} == text_scores


# ---- memory --------------------------------------------------------------------------------------


def test_lengths_that_cannot_fit_are_rejected_and_the_suggested_ones_fit(tmp_path):
    cfg = compose_config("train", ["dataset.train_lengths=[1,100000]", *outputs(tmp_path)])
    budget = MemoryBudget(host=16 * GiB)
    with pytest.raises(ConfigError) as caught:
        check_memory(cfg, budget)
    suggested = int(caught.value.fix.split("dataset.train_lengths=[1,")[1].split("]")[0])
    assert 1 < suggested < 100000
    assert budget.fits(length_need(cfg, "dataset.train_lengths", suggested))
    assert not budget.fits(length_need(cfg, "dataset.train_lengths", suggested + 1))
    # a batch of attention weights alone: B × T_dec × T_enc × 4 bytes
    assert length_need(cfg, "dataset.train_lengths").batch >= 64 * 100001 * 100000 * 4
    check_memory(compose_config("train", outputs(tmp_path)), budget)  # the default fits


def test_on_an_accelerator_the_batch_is_weighed_against_its_memory(tmp_path):
    cfg = compose_config("train", ["dataset.train_lengths=[1,6000]", *outputs(tmp_path)])
    check_memory(cfg, MemoryBudget(host=16 * GiB, device=16 * GiB))
    with pytest.raises(ConfigError, match="of accelerator memory"):
        check_memory(cfg, MemoryBudget(host=16 * GiB, device=4 * GiB))


def test_evaluation_lengths_that_cannot_fit_name_eval_lengths(tmp_path):
    cfg = compose_config("train", ["dataset.eval_lengths=[1,50000]", *outputs(tmp_path)])
    with pytest.raises(ConfigError, match=r"dataset\.eval_lengths=\[1,50000\]"):
        check_memory(cfg, MemoryBudget(host=16 * GiB))


# ---- arguments handed on: bound to the callable's signature ---------------------------------------


def test_handed_on_arguments_are_bound_to_the_signature_with_their_annotations():
    def receiver(lr: float = 0.1, betas: tuple[float, float] = (0.9, 0.99), mode: typing.Literal["a", "b"] = "a",
                 steps: int | None = None) -> None: ...

    good = {"lr": 1, "betas": [0.9, 0.999], "mode": "b", "steps": None}
    assert bound("optimizer", good, receiver, "receiver") == []
    problems = bound("optimizer", {"lrr": 1.0, "mode": "c", "steps": 2.5, "betas": [0.9]}, receiver, "receiver")
    assert [p.problem.split(" ")[0] for p in problems] == ["optimizer.lrr", "optimizer.mode=c", "optimizer.steps=2.5",
                                                         "optimizer.betas=[0.9]"]
    assert "Did you mean optimizer.lr?" in problems[0].problem and "~optimizer.lrr" in problems[0].fix


def test_annotations_are_described_in_words():
    assert describe(typing.Optional[int]) == "a whole number, or null"
    assert describe(typing.Literal["max", "min"]) == "one of max, min"
    assert describe(list[typing.Literal["max", "min"]]) == "a list of values from max, min"


ANNOTATED = [
    typing.Optional[bool],
    typing.Literal["max", "min"],
    typing.Annotated[int, Field(ge=2)],
    typing.Annotated[int, Field(gt=0)],
    typing.Annotated[int, Field(gt=0, lt=2)],
    typing.Annotated[float, Field(gt=0, lt=1)],
    typing.Annotated[float, Field(gt=0)],
    typing.Annotated[float, Field(lt=0)],
    typing.Annotated[float, Field(le=-3)],
    typing.Optional[typing.Annotated[float, Field(gt=0, le=10)]],
    int,
]


@pytest.mark.parametrize("annotation", ANNOTATED, ids=[str(a) for a in ANNOTATED])
def test_a_field_without_example_or_default_gets_one_its_type_accepts(annotation):
    """A fix's example where the field names none (``+optimizer.fused=maybe``): a value the field takes."""
    example = allowed(schema_of(annotation))
    assert example != "…"
    TypeAdapter(annotation).validate_python(example)  # raises if the example is not one
    assert allowed(schema_of(list[int])) == "…"  # a list has no one value that stands for it


# ---- evaluate(cfg) ---------------------------------------------------------------------------------

EVALUATE_BAD = [
    (["eval.lengths=[1]"], "eval.lengths=[1]", "eval.lengths=[1,80]"),
    (["eval.batch_size=abc"], "eval.batch_size=abc", "eval.batch_size=128"),
    (["eval.beam_size=0"], "eval.beam_size=0", "eval.beam_size=1"),
    (["model=averaged"], "model=averaged must be one of model, averaged_model", "set model to one of"),
    (["eval.beam_size=2", "eval.n_best=3"], "eval.n_best=3 is more than eval.beam_size=2", "eval.beam_size=3"),
    (["eval.n_best=0"], "eval.n_best=0", "eval.n_best=1"),
    (["eval.length_penalty=-0.5"], "eval.length_penalty=-0.5", "eval.length_penalty=0.6"),
    (["eval.bootstrap_samples=10"], "eval.bootstrap_samples=10", "eval.bootstrap_samples=1000"),
    (["eval.bootstrap_seed=0"], "eval.bootstrap_seed=0", "eval.bootstrap_seed=12345"),
    (["eval.explorer_samples=51"], "eval.explorer_samples=51", "eval.explorer_samples=4"),
    (["run_id=null", "experiment_name=x", "filter='params.scorer = dot'"], "not MLflow search syntax",
     "\"filter='params."),
    (["run_id=null", "filter='params.x = \"1\"'"], "experiment_name is not set", "experiment_name=<name>"),
]


@pytest.mark.parametrize(("overrides", "problem", "fix"), EVALUATE_BAD, ids=[" ".join(c[0]) for c in EVALUATE_BAD])
def test_evaluate_checks_its_keys_before_opening_the_store(overrides, problem, fix, tmp_path):
    cfg = compose_config("evaluate", ["run_id=0123456789abcdef0123456789abcdef", *overrides,
                                      f"paths.output_dir={tmp_path / 'out'}",
                                      f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    with pytest.raises(ConfigError) as caught:
        evaluate(cfg)
    assert problem in caught.value.problem and fix in caught.value.fix, caught.value
    assert list(tmp_path.iterdir()) == []


# ---- Hydra's own config errors, in our words ------------------------------------------------------


def hydra_error(name: str, overrides: list[str]) -> Exception:
    with pytest.raises((MissingConfigException, ConfigCompositionException)) as caught:
        compose_config(name, overrides)
    return caught.value


def test_an_unknown_key_suggests_the_closest_existing_one_not_a_plus():
    error = as_config_error(hydra_error("train", ["modle.heads=2"]), "train")
    assert "modle.heads is not a key" in error.problem and "Did you mean model.heads?" in error.problem
    assert error.fix == "use model.heads=2."
    assert "+modle" not in str(error)
    error = as_config_error(hydra_error("train", ["scorer.atn_dim=16"]), "train")
    assert "Did you mean scorer.attn_dim?" in error.problem
    error = as_config_error(hydra_error("evaluate", ["eval.batchsize=16"]), "evaluate")
    assert error.fix == "use eval.batch_size=16."


def test_an_unknown_option_lists_the_options_and_the_closest():
    error = as_config_error(hydra_error("train", ["scorer=dott"]), "train")
    assert "Available options in 'scorer': additive, concat, dot" in error.problem
    assert "Did you mean scorer=dot?" in error.problem and error.fix == "use one of them, e.g. scorer=dot."


def test_the_known_keys_are_those_of_the_primary_config_and_its_groups():
    keys = set(known_keys("train"))
    assert {"model.heads", "scorer.attn_dim", "dataset.path", "trainer.max_epochs", "decoder.input_feeding"} <= keys
    assert not any(key.startswith("hydra") for key in keys)
    assert set(known_keys("evaluate")) >= {"eval.batch_size", "filter"} and "model.heads" not in known_keys("evaluate")


# ---- through the real CLIs: exit 2, one message, no traceback, no store -----------------------------

CLI = [
    ("train", ["model.dropout=abc"], ["error: model.dropout=abc must be a number in [0, 1)", "Fix:"]),
    ("train", ["modle.heads=2"], ["Did you mean model.heads?", "Fix: use model.heads=2."]),
    ("train", ["trainer.foo=1"], ["trainer.foo", "+trainer.foo=1"]),  # new keys come with +: not "meant" as trainer
    ("train", ["scorer=dott"], ["scorer=dott is not an option", "Fix: use one of them, e.g. scorer=dot."]),
    ("train", ["encoder=transformer", "encoder.heads=5"],
     ["error: encoder.heads=5 does not divide model.hidden_size=128", "Fix: set encoder.heads to one of"]),
    ("train", ["encoder=transformer", "encoder.ff_dim=0"], ["error: encoder.ff_dim=0 must be", "Fix:"]),
    ("train", ["encoder=transformer", "encoder.bidirectional=true"],
     ["error: encoder.bidirectional=true with encoder=transformer", "Fix: drop encoder.bidirectional"]),
    ("train", ["scorer=multihead", "model.heads=4", "scorer.model_dim=6"],
     ["error: scorer.model_dim=6 must be a positive multiple of model.heads=4", "Fix:"]),
    ("train", ["average.k=9", "trainer.max_epochs=3"],
     ["error: average.k=9 is more than the 3 checkpoints", "Fix: set average.k to at most 3"]),
    # handed on to Lightning and torch (stage two): checked once they are imported, before Hydra's run folder
    ("train", ["+trainer.max_epoch=3"], ["trainer.max_epoch", "Did you mean", "Fix:"]),
    ("train", ["optimizer._target_=torch.optim.Adamm"], ["optimizer._target_=torch.optim.Adamm", "Fix:"]),
    ("evaluate", ["run_id=0123456789abcdef0123456789abcdef", "eval.lengths=[1]"], ["eval.lengths=[1]", "Fix:"]),
    ("evaluate", ["experiment_name=x", "filter='params.scorer = dot'"], ["not MLflow search syntax", "Fix:"]),
    ("evaluate", ["experiment_name=x", "filter=params.a = "], ["an override cannot be parsed", "Fix:"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("script", "overrides", "fragments"), CLI, ids=[f"{s} {' '.join(o)}" for s, o, _ in CLI])
def test_a_bad_config_exits_2_with_one_message_and_creates_no_store_or_folder(script, overrides, fragments, tmp_path):
    path = EVALUATE_PY if script == "evaluate" else None
    args = [*overrides, *(outputs_under(tmp_path) if path is None else
                          [f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.run.dir={tmp_path}/out"])]
    proc = run_cli(tmp_path, *args, env=user_env(), timeout=120, **({"script": path} if path else {}))
    assert proc.returncode == 2, explain(proc)
    assert "Traceback" not in proc.stderr and proc.stderr.count("error: ") == 1, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    assert not (tmp_path / "out").exists()  # Hydra's run folder: the command stopped before Hydra ran


@pytest.mark.slow
def test_hydra_help_still_works(tmp_path):
    """``--help`` is attnseq's own (tests/test_console.py); Hydra's stays one flag away."""
    proc = run_cli(tmp_path, "--hydra-help", timeout=120, env=user_env())
    assert proc.returncode == 0, explain(proc)
    assert "== Flags ==" in proc.stdout and "--cfg,-c" in proc.stdout
