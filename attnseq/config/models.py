"""The typed configs of ``conf/train.yaml``, ``conf/evaluate.yaml`` and ``conf/translate.yaml``: each
key's type, range and meaning on one line (the yaml holds the defaults). The encoder, scorer, decoder
and dataset groups are the registered choices' own settings, a discriminated union on their name
(``train_config_model``). attnseq's own groups take a key added with ``+`` (only the run's params
read it); the groups handed on as arguments (``HANDED_ON``) are checked against their callable's
signature in stage two. Torch-free."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, create_model
from pydantic.functional_validators import AfterValidator

from attnseq.attention.settings import LOCAL_ATTENTION, GlobalSettings
from attnseq.data.tasks import TASKS, dataset_model
from attnseq.metrics.declarations import SCORES
from attnseq.metrics.faithfulness import FaithSettings, TrainFaithSettings
from attnseq.model.config import CHOICES, MAX_BEAM_SIZE, ModelGroup
from attnseq.problems import PAIR, Text, What, _pair

Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
Threads = Annotated[int, Field(ge=1, le=1024)]  # more than any machine's cores; torch refuses far more
CountOrFraction = Annotated[NonNegativeInt | Annotated[float, Field(ge=0, le=1)],
                            What("a whole number of batches ≥ 0 or a fraction in [0, 1]")]
# evaluation: a batch's attention (B × T_out × T_enc floats) grows with a length's square (128 × 1500 × 1000: 0.8 GB)
EvalLengths = Annotated[list[Annotated[int, Field(le=1000)]], AfterValidator(_pair), What(f"{PAIR}, hi ≤ 1000")]
EvalBeam = Annotated[int, Field(ge=1, le=64)]  # evaluate.py's beam_size and n_best: a step costs beam_size greedy ones
ServedBeam = Annotated[int, Field(ge=1, le=MAX_BEAM_SIZE)]  # translate.py's, as the served model's max_beam_size
EvalSentences = Annotated[list[Annotated[str, Field(min_length=1, max_length=1000)]], Field(max_length=100),
                          What("a list of at most 100 texts of 1 to 1000 characters")]


class Group(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True, allow_inf_nan=False, populate_by_name=True)


class Optimizer(Group):
    target: Text = Field(alias="_target_", description="the optimizer class", examples=["torch.optim.Adam"])
    partial: Annotated[Literal[True], What("true (the model's parameters are passed later)")] = Field(
        alias="_partial_", examples=[True])
    lr: PositiveFloat | None = Field(None, le=10, description="the learning rate (≤ 10: a larger step diverges)",
                                     examples=[0.003])
    weight_decay: float | None = Field(None, ge=0, le=1, description="weight decay; null: the optimizer's own "
                                       "default (AdamW's 0.01, Adam's 0)", examples=[0.0])


class Scheduler(Group):
    """A learning-rate scheduler (``conf/lr_schedule/``); ``interval`` is attnseq's, the other keys its class's
    (checked by binding to its signature: ``attnseq.training.schedules`` gives its own classes' ranges)."""

    READ_BY_ATTNSEQ: ClassVar[tuple[str, ...]] = ("interval",)  # not handed on to the class
    target: Text = Field(alias="_target_", description="the scheduler class; scheduler=null: a constant rate",
                         examples=["torch.optim.lr_scheduler.ExponentialLR"])
    partial: Annotated[Literal[True], What("true (the optimizer is passed later)")] = Field(
        alias="_partial_", examples=[True])
    interval: Literal["epoch", "step"] = Field("epoch", description="epoch: stepped once per epoch; step: once per "
                                               "optimizer step (after trainer.accumulate_grad_batches batches)")


class Training(Group):
    teacher_forcing: float = Field(ge=0, le=1, description="probability of feeding the gold token; < 1 is "
                                   "scheduled sampling", examples=[1.0])
    test_after_fit: bool = Field(description="evaluate the best checkpoint on the test split after training",
                                 examples=[False])
    stop_at: float | None = Field(None, description="stop at the first validation where checkpoint.monitor "
                                  "reaches this", examples=[0.95])
    val_text_scores: list[Literal[SCORES]] = Field(
        ["sacrebleu", "chrf"], description="a text task's scores at each validation (val/<score>); TER's shift search "
        "takes seconds per thousand outputs far from their references: [sacrebleu,chrf,ter] adds it (test and "
        "evaluate.py score all three)", examples=[["sacrebleu", "chrf", "ter"]])
    label_smoothing: float = Field(0.0, ge=0, lt=1, description="ε of the training loss: target (1 - ε) on the gold "
                                   "token + ε/V on each of the V tokens; val/loss stays the plain cross-entropy",
                                   examples=[0.1])


KEYS_ADDED_SINCE: dict[str, object] = {"training.val_text_scores": list(SCORES)}
"""Keys a run trained before they existed lacks in its stored config, each with the value that does what
such a run did (validation scored TER too): ``resume=`` sets them (``validate.as_it_ran``)."""


class Decode(Group):
    max_length_ratio: float = Field(gt=0, le=10, description="greedy decoding at validation: ratio × longest "
                                    "source + extra tokens", examples=[1.5])
    max_length_extra: NonNegativeInt = Field(le=1000, description="the extra tokens", examples=[5])


class Checkpoint(Group):
    monitor: Text = Field(description="the metric the best checkpoint is chosen by (one this run logs)",
                          examples=["val/exact_match"])
    mode: Literal["max", "min"] = Field(description="max: higher is better")


class Average(Group):
    k: PositiveInt | None = Field(None, le=100, description="how many validation checkpoints are averaged into "
                                  "the run's averaged_model when training ends; null = off", examples=[5])
    of: Literal["last", "best"] = Field("last", description="last: the k latest checkpoints; best: the k best by "
                                        "checkpoint.monitor and checkpoint.mode")


class Tracking(Group):
    heatmap_samples: NonNegativeInt = Field(description="attention heatmaps logged: short, medium, longer than "
                                            "training", examples=[3])
    heatmap_every_n_epochs: PositiveInt = Field(description="every n epochs, at the epoch's first validation "
                                                "(not at each of trainer.val_check_interval's)", examples=[1])


class Heartbeat(Group):
    every_s: float = Field(ge=0, description="how often, at most, the run's heartbeat tag is refreshed",
                           examples=[30])
    stale_after_s: float = Field(gt=0, description="resume= refuses a RUNNING run whose heartbeat is younger",
                                 examples=[180])


class Mlflow(Group):
    tracking_uri: Text = Field(description="the MLflow store", examples=["sqlite:///mlflow.db"])
    retry_budget_s: float = Field(gt=0, le=86400, description="how long one call may retry a server that stopped "
                                  "answering (a day at most)", examples=[30])


class TrainMlflow(Mlflow):
    experiment_name: Text = Field(description="the MLflow experiment", examples=["attnseq"])
    run_name: Text | None = Field(description="default: built from the choices, or a sweep's varying overrides",
                                  examples=["my-run"])


class Paths(Group):
    output_dir: Text = Field(description="this run's folder (Hydra's by default)", examples=["outputs/my-run"])


class Trainer(Group):
    """The ``lightning.Trainer`` arguments that need a sensible range (the others: its signature)."""

    NULL_HANDED_ON: ClassVar[tuple[str, ...]] = ("check_val_every_n_epoch",)  # set to null: handed on as None

    max_epochs: PositiveInt | None = Field(None, description="epochs to train", examples=[5])
    devices: Annotated[PositiveInt | Literal[-1, "auto"] | Annotated[list[NonNegativeInt], Field(min_length=1)]
                       | Annotated[str, Field(pattern=r"^(0*[1-9][0-9]*|-1|([0-9]+,)+[0-9]*)$")],
                       What("a number of devices ≥ 1, -1 (all), auto, or a list of device indices")] = \
        Field("auto", examples=[1])
    num_nodes: PositiveInt | None = Field(None, examples=[1])
    val_check_interval: Annotated[PositiveInt | Annotated[float, Field(gt=0, le=1)] | Text | dict[str, int],
                                  What("a whole number of batches ≥ 1, a fraction in (0, 1] of an epoch or a "
                                       "duration 'DD:HH:MM:SS'")] | None = Field(None, examples=[1.0])
    min_epochs: NonNegativeInt | None = Field(None, examples=[1])
    max_steps: Annotated[int, Field(ge=-1), What("a whole number ≥ 1, or -1 (no limit)")] = Field(-1, examples=[-1])
    log_every_n_steps: PositiveInt | None = Field(None, examples=[50])
    check_val_every_n_epoch: PositiveInt | None = Field(
        None, description="validate at every n-th epoch; null (+trainer.check_val_every_n_epoch=null): a whole "
        "trainer.val_check_interval counts batches over the whole run, not within each epoch", examples=[1])
    accumulate_grad_batches: PositiveInt | None = Field(None, le=10_000, description="batches whose gradients add "
                                                        "up before each optimizer step (each batch's loss ÷ this)",
                                                        examples=[2])
    gradient_clip_val: Annotated[float, Field(ge=0)] | None = Field(None, examples=[1.0])
    num_sanity_val_steps: Annotated[int, Field(ge=-1), What("a whole number ≥ 0, or -1 (all batches)")] | None = \
        Field(None, examples=[2])
    fast_dev_run: Annotated[bool | PositiveInt, What("true, false or a whole number of batches ≥ 1")] = \
        Field(False, examples=[True])
    overfit_batches: CountOrFraction = Field(0, examples=[4])
    limit_train_batches: CountOrFraction | None = Field(None, examples=[1.0])
    limit_val_batches: CountOrFraction | None = Field(None, examples=[1.0])
    limit_test_batches: CountOrFraction | None = Field(None, examples=[1.0])


class TrainBase(Group):
    """``conf/train.yaml``; the choice groups are added by ``train_config_model``."""

    seed: Seed = Field(description="fixes the data and the initialisation", examples=[0])
    resume: Text | None = Field(description="a run id: continue that interrupted run from its last checkpoint",
                                examples=["<run id>"])
    resume_force: bool = Field(description="resume even a RUNNING run whose heartbeat is fresh", examples=[False])
    threads: Threads | None = Field(description="torch CPU threads; 1 when jobs run side by side", examples=[1])
    plugins: list[Text] = Field(description="modules to import first: choices defined outside attnseq",
                                examples=[["my_scorers"]])
    optimized_metric: Text = Field(description="what train() returns to a sweeper (a metric this run logs)",
                                   examples=["val/acc_best"])
    model: ModelGroup
    optimizer: Optimizer
    scheduler: Scheduler | None = None  # scheduler=null: Hydra leaves the group out
    training: Training
    decode: Decode
    checkpoint: Checkpoint
    average: Average = Average()  # absent from a run saved before it: off
    faith: TrainFaithSettings = TrainFaithSettings()  # absent from a run saved before it: off
    tracking: Tracking
    heartbeat: Heartbeat
    mlflow: TrainMlflow
    paths: Paths
    trainer: Trainer


def train_config_model() -> type[TrainBase]:
    """``TrainConfig`` with every choice registered now (the built-in ones and the plugins')."""
    key = tuple(tuple(registry) for registry in (*CHOICES.values(), TASKS))
    if key not in _MODELS:
        _MODELS[key] = create_model(
            "TrainConfig", __base__=TrainBase, __module__=__name__, dataset=(TASKS.union(dataset_model), ...),
            **{group: (registry.union(), GlobalSettings() if registry is LOCAL_ATTENTION else ...)
               for group, registry in CHOICES.items()},  # attention: absent from a run saved before it, so global
        )
    return _MODELS[key]


_MODELS: dict[tuple, type[TrainBase]] = {}
HANDED_ON = (Trainer, Optimizer, Scheduler)  # their other keys: the callable's signature (stage two)
TrainConfig = TrainBase  # the type to annotate with; its instances come from train_config_model()


class Eval(Group):
    """Each size bounded by what one evaluation may cost: data, decoding time, a batch's attention."""

    lengths: EvalLengths | None = Field(description="[lo, hi]; null = [1, 2 × the run's longest training length]",
                                        examples=[[1, 80]])
    bucket_width: PositiveInt | None = Field(description="null = the run's own", examples=[5])
    size: int = Field(ge=1, le=1_000_000, description="evaluation examples (source lengths uniform over "
                      "eval.lengths)", examples=[2000])
    batch_size: int = Field(ge=1, le=4096, description="examples per batch", examples=[128])
    beam_size: EvalBeam = Field(description="1 = greedy decoding; each step costs beam_size × a greedy one",
                                examples=[1])
    length_penalty: float = Field(ge=0, le=10, description="beam search's GNMT α: hypotheses ranked by log p / "
                                  "((5 + length) / 6)^α; 0 ranks by log-probability", examples=[0.6])
    n_best: EvalBeam = Field(description="≤ eval.beam_size: the n best hypotheses of each example, with their "
                             "scores, as the evaluation run's n-best table (the metrics read the best)", examples=[1])
    counterfactual: bool = Field(description="Jain & Wallace check: permuted and uniform attention", examples=[True])
    seed: Seed = Field(description="the evaluation data's seed", examples=[1])
    bootstrap_samples: int = Field(ge=100, le=100_000, description="a comparison's paired bootstrap: resamples of "
                                   "the shared test sequences per pair of groups and metric (memory: resamples × "
                                   "sequences × 8 bytes, ×24 for chrF)", examples=[1000])
    bootstrap_seed: int = Field(ge=1, le=2**31 - 1, description="the paired bootstrap's seed (evaluate.py hands it "
                                "to sacreBLEU's bootstrap of the text scores as SACREBLEU_SEED)",
                                examples=[12345])
    sentences: EvalSentences = Field(description="source texts to draw the attention of", examples=[["Unknown object"]])
    explorer_samples: int = Field(ge=0, le=50, description="examples in the evaluation run's attention explorer "
                                  "(an HTML page in its artifacts, explorer/), spread over the evaluated lengths, "
                                  "with their importance measures (faith.measures); 0 = no explorer", examples=[4])


class EvalConfig(Group):
    """``conf/evaluate.yaml``: which runs, and how they are evaluated."""

    run_id: Text | None = Field(description="one run to evaluate", examples=["<run id>"])
    run_ids: list[Text] | None = Field(description="several runs, then a comparison", examples=[["<id>", "<id>"]])
    parent_run_id: Text | None = Field(description="a sweep's parent run id, or latest", examples=["latest"])
    experiment_name: Text | None = Field(description="the experiment to select runs from", examples=["bottleneck"])
    filter: Text | None = Field(description="MLflow search syntax, with experiment_name",
                                examples=["params.`scorer.name` = 'dot'"])
    model: Literal["model", "averaged_model"] = Field(
        "model", description="which of each run's MLflow models: model (its best checkpoint) or averaged_model "
        "(its averaged checkpoints: train.py average.k=...)")
    eval: Eval
    faith: FaithSettings = FaithSettings()
    compare: bool = Field(description="with several runs: comparison figure + table + a comparison run",
                          examples=[True])
    threads: Threads | None = Field(description="torch CPU threads; null = every core", examples=[1])
    plugins: list[Text] = Field(description="modules to import (runs their code): those the runs were trained with",
                                examples=[["my_scorers"]])
    mlflow: Mlflow
    paths: Paths


class TranslateConfig(Group):
    """``conf/translate.yaml``: the run whose model translates, and how it decodes."""

    run_id: Text = Field(description="a training run's id, or latest: the newest finished training run",
                         examples=["latest"])
    experiment_name: Text | None = Field(description="with run_id=latest: the newest in this experiment",
                                         examples=["attnseq"])
    beam_size: ServedBeam = Field(description=f"1 = greedy decoding; at most {MAX_BEAM_SIZE}, as the served "
                                  "model (its max_beam_size)", examples=[4])
    length_penalty: float = Field(ge=0, description="beam search's GNMT α; 0 ranks by log-probability",
                                  examples=[0.6])
    n_best: ServedBeam = Field(description="≤ beam_size: print each source's n best outputs, a line each: "
                               "source number, score, output", examples=[3])
    heatmaps: Text | None = Field(description="a folder: each source's attention heatmap as source_<n>.png "
                                  "(a Transformer's self-attention too: self_attention/encoder_source_<n>.png, "
                                  "self_attention/decoder_source_<n>.png); or a .png file for one source",
                                  examples=["heatmaps"])
    plugins: list[Text] = Field(description="modules to import (runs their code): those the run was trained with",
                                examples=[["my_scorers"]])
    threads: Threads | None = Field(description="torch CPU threads; null = every core", examples=[1])
    mlflow: Mlflow
