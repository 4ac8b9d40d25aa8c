"""Batching by number of tokens (``dataset.batch_type=token``, ``TokenBudgetBatchSampler``): every batch's padded
size within the budget, counted on the tensors ``collate`` makes; every example exactly once per epoch; the
same seed and epoch the same batches; data-parallel shards; a budget that cannot hold the largest example
refused with the key and a fix; in-process. Then one train.py launch: the optimizer steps of its epoch are
as many as token batches the run's own training examples pack into."""

from __future__ import annotations

import random
import re

import lightning as L
import pytest
import torch

from attnseq.data.batch import collate
from attnseq.data.datamodule import Seq2SeqDataModule
from attnseq.data.example import EncodedExample
from attnseq.data.sampler import TokenBudgetBatchSampler, example_size
from attnseq.errors import ConfigError


def examples(n: int, seed: int = 0, longest: int = 30) -> list[EncodedExample]:
    """Source and target lengths drawn independently (a target may be longer than its source)."""
    rng = random.Random(seed)
    return [EncodedExample([4] * rng.randint(1, longest), [5] * rng.randint(0, longest)) for _ in range(n)]


def padded_size(items: list[EncodedExample], batch: list[int]) -> int:
    """The batch's largest padded tensor, read off what collate makes: B × max(T_src, T_tgt)."""
    packed = collate([items[i] for i in batch])
    return max(packed.src.numel(), packed.tgt_in.numel())


def sampler(items, budget, shuffle=True, seed=0, **kwargs) -> TokenBudgetBatchSampler:
    return TokenBudgetBatchSampler([example_size(len(x.src), len(x.tgt)) for x in items], budget,
                                   shuffle=shuffle, seed=seed, **kwargs)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("n", "budget"), [(1, 64), (10, 31), (500, 31), (500, 100), (2000, 1024)])
def test_every_batch_within_the_budget_and_every_example_once_per_epoch(n, budget, shuffle):
    items = examples(n, seed=n)
    batches_of = sampler(items, budget, shuffle=shuffle)
    for epoch in range(3):
        batches_of.set_epoch(epoch)
        batches = list(batches_of)
        assert all(padded_size(items, batch) <= budget for batch in batches)
        assert sorted(i for batch in batches for i in batch) == list(range(n))
        assert len(batches) == len(batches_of)


def test_batches_are_packed_greedily_in_size_order():
    """Sorted by size, each batch is closed only when the next example would pass the budget, so the count
    is the greedy packing's of the sorted sizes: an independent count of it."""
    items = examples(3000, seed=7)
    budget = 200
    batches = list(sampler(items, budget, shuffle=False))
    sizes = sorted(example_size(len(x.src), len(x.tgt)) for x in items)
    count, members = 0, 0
    for size in sizes:  # ascending: the newest member is the largest
        if members and (members + 1) * size > budget:
            count, members = count + 1, 0
        members += 1
    assert len(batches) == count + 1
    flat = [example_size(len(items[i].src), len(items[i].tgt)) for batch in batches for i in batch]
    assert flat == sizes  # evaluation: in size order


def test_the_same_seed_and_epoch_give_the_same_batches():
    items = examples(1500, seed=3)

    def batches(seed, epoch):
        made = sampler(items, 256, seed=seed)
        made.set_epoch(epoch)
        return list(made)

    assert batches(0, 2) == batches(0, 2)
    assert batches(0, 2) != batches(0, 3)  # reshuffled every epoch
    assert batches(0, 2) != batches(1, 2)
    assert len(batches(0, 2)) == len(batches(0, 3))  # the same count every epoch: len() holds for all of them


def test_a_budget_below_the_largest_example_is_refused():
    items = [EncodedExample([4] * 20, [5] * 20)]  # 21 positions: the target and its EOS
    assert example_size(20, 20) == 21
    sampler(items, 21)
    with pytest.raises(ValueError, match="max_tokens=20 is smaller than the largest example"):
        sampler(items, 20)


@pytest.mark.parametrize("replicas", [2, 3])
def test_data_parallel_shards(replicas):
    """Training: equal step counts, disjoint, every replicas-th batch of the one global order; evaluation:
    every example exactly once over the processes."""
    items = examples(1000, seed=11)
    single = sampler(items, 300, seed=5)
    single.set_epoch(1)
    everything = list(single)
    shards, seen = [], []
    for rank in range(replicas):
        train = sampler(items, 300, seed=5, num_replicas=replicas, rank=rank)
        train.set_epoch(1)
        shards.append(list(train))
        assert len(shards[-1]) == len(train)
        assert shards[-1] == everything[: len(everything) // replicas * replicas][rank::replicas]
        evaluation = sampler(items, 300, shuffle=False, num_replicas=replicas, rank=rank)
        batches = list(evaluation)
        assert len(batches) == len(evaluation) and all(padded_size(items, b) <= 300 for b in batches)
        seen += [i for batch in batches for i in batch]
    assert len({len(shard) for shard in shards}) == 1
    indices = [i for shard in shards for batch in shard for i in batch]
    assert len(indices) == len(set(indices))
    assert sorted(seen) == list(range(1000))


# ---- through the data module and its config --------------------------------------------------


def make(**overrides) -> Seq2SeqDataModule:
    kwargs = dict(task="translate", train_lengths=(2, 12), eval_lengths=(2, 20), bucket_width=5, train_size=400,
                  val_size=100, test_size=100, batch_size=120, batch_type="token", seed=0)
    return Seq2SeqDataModule(**{**kwargs, **overrides})


def test_the_data_module_batches_every_split_by_tokens():
    data = make()
    data.setup()
    splits = {"train": data.train_dataloader, "val": data.val_dataloader, "test": data.test_dataloader}
    for split, loader in splits.items():
        batches = list(loader())
        assert all(max(b.src.numel(), b.tgt_in.numel()) <= 120 for b in batches), split
        assert sum(len(b) for b in batches) == len(data._encoded[split])
    assert max(len(b) for b in data.train_dataloader()) > 20  # short examples: many of them
    # evaluation elsewhere (make_dataloader, evaluate.py) keeps its own batch size, in examples
    assert max(len(b) for b in data.make_dataloader(data.val_examples, 4)) == 4


def test_lightning_sets_the_epoch_of_the_token_sampler(tmp_path):
    data = make(train_size=64)
    data.setup()

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, batch_idx):
            return (self.weight * len(batch)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                        limit_val_batches=0)
    trainer.fit(Tiny(), datamodule=data)
    assert trainer.train_dataloader.batch_sampler.sampler.epoch == 1


def test_a_budget_smaller_than_the_largest_example_exits_2_with_a_fix():
    """Refused when the data is built (before any MLflow run is made); the fix's value holds every split."""
    data = make(batch_size=15)  # eval lengths reach 20 words
    with pytest.raises(ConfigError) as caught:
        data.setup()
    assert caught.value.exit_code == 2
    assert "dataset.batch_size=15" in caught.value.problem and "dataset.batch_type=token" in caught.value.problem
    suggested = int(re.search(r"dataset\.batch_size=(\d+)", caught.value.fix).group(1))
    unbudgeted = make(batch_type="sentence")
    unbudgeted.setup()
    largest = max(example_size(len(x.src), len(x.tgt)) for split in ("train", "val", "test")
                  for x in unbudgeted._encoded[split])
    assert largest > 15 and f"at least {largest}" in caught.value.fix and suggested >= largest
    make(batch_size=largest).setup()  # the least budget that holds them is accepted


def test_token_batching_without_length_bucketing_is_refused():
    with pytest.raises(ConfigError) as caught:
        make(length_bucketing=False)
    assert "dataset.batch_type=token" in caught.value.problem and "dataset.length_bucketing=true" in caught.value.fix


@pytest.mark.slow
def test_train_py_trains_an_epoch_of_token_batches(tmp_path):
    """``dataset.batch_type=token dataset.batch_size=20`` through the real CLI: the epoch's optimizer steps
    (``train/lr``'s points under a per-step schedule) are the number of batches of at most 20 padded positions that
    the run's training examples make, packed greedily in size order by hand here (each example
    max(source, target + 1) positions), not the ceil(128 / 20) = 7 batches of 20 sentences."""
    import math
    from pathlib import Path

    from cli_helpers import explain, tiny
    from conftest import train_once
    from hydra import compose, initialize_config_dir

    from attnseq.config import validate_train
    from attnseq.training import build_datamodule

    overrides = [*tiny(max_epochs=1, heatmaps=False), "dataset.batch_type=token", "dataset.batch_size=20"]
    per_step = ["lr_schedule=inverse_sqrt", "trainer.log_every_n_steps=1"]  # train/lr: a point per optimizer step
    trained = train_once(tmp_path, *overrides, *per_step)
    assert trained.proc.returncode == 0, explain(trained.proc)
    (run,) = trained.runs
    assert (run.data.params["dataset.batch_type"], run.data.params["dataset.batch_size"]) == ("token", "20")

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"mlflow.tracking_uri=sqlite:///{tmp_path / 'same.db'}",
                                          f"paths.output_dir={tmp_path / 'same'}"])
    data = build_datamodule(validate_train(cfg))
    data.setup()  # the same seed: the run's own training examples
    sizes = sorted(max(len(x.src), len(x.tgt) + 1) for x in data.train_examples)
    batches, held = 0, 0
    for size in sizes:  # ascending: the new example is the batch's largest
        if held and (held + 1) * size > 20:
            batches, held = batches + 1, 0
        held += 1
    batches += held > 0
    assert batches > math.ceil(len(sizes) / 20) and len(sizes) == 128
    steps = {m.step for m in trained.client.get_metric_history(run.info.run_id, "train/lr")}
    assert len(steps) == batches  # one optimizer step per batch
