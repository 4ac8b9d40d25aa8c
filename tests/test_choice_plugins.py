"""An encoder, a decoder convention and a task are each one class and one yaml, like a scorer: each
is defined here outside the package (a module under ``tmp_path`` and its ``conf/<group>/<name>.yaml``),
picked with ``plugins=[module]``, trained through the real ``train.py`` for a few steps, and found in
the MLflow store. ``--help`` and the README's config table list every registered option."""

from __future__ import annotations

import os
import re
import sys
import textwrap
import uuid

import pytest
from cli_helpers import REPO, all_runs, clean_env, explain, outputs_under, run_cli, tiny  # noqa: E402
from mlflow.tracking import MlflowClient
from test_readme import config_table

from attnseq.attention.settings import ScorerSettings
from attnseq.cli_help import config_help
from attnseq.data.tasks import TASKS
from attnseq.model.conventions import DECODER_CONVENTIONS
from attnseq.model.encoders import ENCODER_KINDS

ENCODER = '''
from typing import Literal

import torch
from pydantic import PositiveInt
from torch import nn

from attnseq.model.encoders import EncoderSettings


class BagOfEmbeddings(nn.Module):
    """Keys: each token's embedding mapped to the hidden size; the decoder starts from their mean."""

    def __init__(self, vocab_size, embedding_dim, hidden_size, layers):
        super().__init__()
        self.key_dim, self.layers = hidden_size, layers
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        self.map = nn.Linear(embedding_dim, hidden_size)

    def forward(self, src, src_lengths):
        valid = (torch.arange(src.shape[1])[None, :] < src_lengths[:, None]).unsqueeze(-1)  # (B, T, 1)
        keys = torch.tanh(self.map(self.embedding(src))).masked_fill(~valid, 0.0)  # (B, T, d)
        mean = keys.sum(1) / src_lengths.clamp_min(1)[:, None].to(keys.dtype)  # (B, d)
        return keys, mean.unsqueeze(0).repeat(self.layers, 1, 1).contiguous()  # (L, B, d)


class BagSettings(EncoderSettings):
    kind: Literal["{name}"] = "{name}"
    scale: PositiveInt = 1

    def build(self, config, fast_paths=None):
        return BagOfEmbeddings(config.src_vocab_size, config.embedding_dim, config.hidden_size, config.layers)
'''

DECODER = '''
from typing import Literal

from attnseq.model.conventions import DecoderSettings


class LuongWithoutFeeding(DecoderSettings):
    """Luong's query timing, never feeding h~_{{t-1}}: a convention of its own."""

    convention: Literal["{name}"] = "{name}"

    def build(self, attention, **shared):
        from attnseq.model.decoders import LuongDecoder

        return LuongDecoder(attention, input_feeding=False, **shared)
'''

TASK = '''
from typing import Literal

from attnseq.data.tasks import SymbolTask


class RotateTask(SymbolTask):
    """The source rotated left by one: target i copies source i + 1, the last copies the first."""

    task: Literal["{name}"] = "{name}"

    def target_order(self, symbols):
        return [*range(1, len(symbols)), 0]
'''

CASES = {
    "encoder": (ENCODER, "name: {name}\nkind: {name}\ncell: gru\nbidirectional: false\nscale: 2\n",
                "encoder.kind", ENCODER_KINDS),
    "decoder": (DECODER, "convention: {name}\n", "decoder.convention", DECODER_CONVENTIONS),
    "dataset": (TASK, "task: {name}\nnum_symbols: 10\ntrain_lengths: [1, 6]\neval_lengths: [1, 12]\n"
                "bucket_width: 5\ntrain_size: 128\nval_size: 32\ntest_size: 32\nbatch_size: 32\n",
                "dataset.task", TASKS),
}


@pytest.fixture(scope="module")
def toy_choices(tmp_path_factory):
    """One training that picks a toy of every group in ``CASES`` at once, each defined in a module and
    a yaml of its own under the folder: {group: (module, name)}, the finished process, its one run."""
    root = tmp_path_factory.mktemp("toy_choices")
    tag = uuid.uuid4().hex[:8]
    toys = {group: (f"my_{group}_{tag}", f"toy_{group}_{tag}") for group in CASES}
    for group, (module, name) in toys.items():
        source, yaml, _, _ = CASES[group]
        (root / f"{module}.py").write_text(textwrap.dedent(source.format(name=name)))
        (root / "conf" / group).mkdir(parents=True)
        (root / "conf" / group / f"{name}.yaml").write_text(f"# A toy {group} defined outside attnseq.\n"
                                                         + yaml.format(name=name))
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(REPO), env.get("PYTHONPATH", "")])
    proc = run_cli(root, f"hydra.searchpath=[file://{root / 'conf'}]", *(f"{g}={n}" for g, (_, n) in toys.items()),
                   f"plugins=[{','.join(module for module, _ in toys.values())}]",
                   *tiny(max_epochs=1, heatmaps=False), *outputs_under(root, seeded=True), env=env)
    runs = all_runs(MlflowClient(f"sqlite:///{root}/mlflow.db")) if proc.returncode == 0 else []
    yield toys, proc, runs
    for module, _ in toys.values():
        sys.modules.pop(module, None)


@pytest.mark.slow
@pytest.mark.parametrize("group", CASES)
def test_a_choice_defined_outside_attnseq_trains_through_the_cli(group, toy_choices):
    """Each group's toy, trained in the one run that picks them all (they are independent axes)."""
    toys, proc, runs = toy_choices
    _, _, key, registry = CASES[group]
    _, name = toys[group]
    assert proc.returncode == 0, explain(proc)
    (run,) = runs
    assert run.info.status == "FINISHED" and run.data.params[key] == name
    assert 0.0 <= run.data.metrics["val/acc"] <= 1.0
    if group == "encoder":
        assert run.data.params["encoder.scale"] == "2"
    if group == "dataset":  # the task declares a gold alignment: the alignment metrics are logged
        assert 0.0 <= run.data.metrics["val/align_acc"] <= 1.0
    assert name not in registry  # registered in the training process, not in this one


# ---- every registered option is offered --------------------------------------------------------

CONF = REPO / "conf"
REGISTERED = {"scorer": ScorerSettings.registry, "decoder": DECODER_CONVENTIONS, "dataset": TASKS}
"""The groups whose options are a registry's names; an encoder option names its kind (``kind``)."""


def options_in_help(group: str) -> set[str]:
    section = config_help("train").split(f"\n  {group}:\n", 1)[1]
    section = re.split(r"\n  (?=\S)|\n\n", section, maxsplit=1)[0]  # up to the next group
    return set(re.findall(r"^   [ *] (\S+)", section, re.M))


def options_in_readme(group: str) -> set[str]:
    return set(config_table()[group])  # the table's own parser; test_readme.py holds the table to conf/ exactly


@pytest.mark.parametrize("group", [*REGISTERED, "encoder"])
def test_help_and_the_readme_list_every_registered_option(group):
    files = {path.stem for path in (CONF / group).glob("*.yaml")}
    # attnseq's own choices: other tests in this process register plugin choices of their own
    built_in = {name for name, cls in REGISTERED.get(group, {}).items() if cls.__module__.startswith("attnseq.")}
    if group == "encoder":
        from omegaconf import OmegaConf

        kinds = {OmegaConf.load(CONF / group / f"{name}.yaml").get("kind", ENCODER_KINDS.default) for name in files}
        assert kinds == {k for k, cls in ENCODER_KINDS.items() if cls.__module__.startswith("attnseq.")}  # one each
    assert built_in <= files  # every registered choice has its yaml
    assert files <= options_in_help(group), (group, options_in_help(group))
    assert files <= options_in_readme(group), (group, options_in_readme(group))


def test_a_run_of_a_plugin_task_is_evaluated_after_its_plugins_are_imported(tmp_path, monkeypatch):
    """``evaluate.py`` rebuilds a run's data from its saved config: once the run's ``plugins`` are
    imported on request (``plugins=[...]``), they register its task, so a run of a task defined
    outside attnseq can be evaluated; before that, the evaluation refuses and names them."""
    import importlib
    from types import SimpleNamespace

    from attnseq.errors import ConfigError
    from attnseq.evaluation.evaluator import EvalSettings, evaluation_examples

    tag = uuid.uuid4().hex[:8]
    module, name = f"my_task_{tag}", f"toy_{tag}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(TASK.format(name=name)))
    monkeypatch.syspath_prepend(str(tmp_path))
    dataset = {"task": name, "num_symbols": 10, "train_lengths": [1, 6], "eval_lengths": [1, 12], "bucket_width": 5,
               "train_size": 8, "val_size": 8, "test_size": 8, "batch_size": 8}
    trained = SimpleNamespace(config={"plugins": [module], "seed": 0, "dataset": dataset},
                              src_tokenizer=None, tgt_tokenizer=None)
    try:
        with pytest.raises(ConfigError, match=f"plugins=\\[{module}\\]"):
            evaluation_examples(trained, EvalSettings(lengths=(1, 12), bucket_width=5, size=16))
        assert module not in sys.modules  # its code did not run
        importlib.import_module(module)  # what evaluate.py plugins=[module] does
        examples = evaluation_examples(trained, EvalSettings(lengths=(1, 12), bucket_width=5, size=16))
        assert len(examples) == 16
        for example in examples:  # target i copies source i + 1, the last copies the first
            assert example.tgt == [*example.src[1:], example.src[0]]
    finally:
        TASKS.pop(name, None)
        sys.modules.pop(module, None)
