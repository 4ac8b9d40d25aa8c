"""Seq2SeqDataModule end to end for every task, argument checks, and a Lightning fit smoke test."""

import lightning as L
import pytest
import torch

from attnseq.data.batch import Batch
from attnseq.data.datamodule import Seq2SeqDataModule
from attnseq.data.errors import DataError
from attnseq.data.tasks import DICTIONARY, generate
from attnseq.data.tasks import TASKS as TASK_REGISTRY
from attnseq.data.vocab import SPECIAL_TOKENS, UNK

WORDS = "the cat sees a black dog and my red bird likes this fast mouse".split()


@pytest.fixture
def corpus(tmp_path):
    """A 300-line TSV whose source lengths run from 1 to 12 tokens."""
    lines = []
    for i in range(300):
        n = 1 + i % 12
        src = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n))
        lines.append(f"{src.capitalize()}.\tT{i % 17} {src.upper()}")
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make(task, corpus=None, **overrides):
    kwargs = dict(
        task=task, train_lengths=(1, 6), eval_lengths=(1, 10), bucket_width=5,
        train_size=64, val_size=24, test_size=24, batch_size=8, seed=0,
    )
    if corpus is not None:
        kwargs["path"] = str(corpus)
    kwargs.update(overrides)
    return Seq2SeqDataModule(**kwargs)


# The source tokens one eval example may hold, per task, and the expected vocabulary sizes.
SYMBOLS = {f"s{k}" for k in range(10)}
EXPECTED_VOCAB = {
    "copy": (len(SYMBOLS), len(SYMBOLS)),
    "reverse": (len(SYMBOLS), len(SYMBOLS)),
    "sort": (len(SYMBOLS), len(SYMBOLS)),
    "translate": (len(set(DICTIONARY)), len(set(DICTIONARY.values()))),
}
TASKS = list(TASK_REGISTRY)  # every registered task: the generated ones and the corpus


@pytest.mark.parametrize("task", TASKS)
def test_end_to_end(task, corpus):
    dm = make(task, None if TASK_REGISTRY.lookup(task).generated else corpus)
    dm.setup()
    train_batch = next(iter(dm.train_dataloader()))
    val_batch = next(iter(dm.val_dataloader()))
    test_batch = next(iter(dm.test_dataloader()))
    for batch in (train_batch, val_batch, test_batch):
        assert isinstance(batch, Batch) and 1 <= len(batch) <= 8
        assert int(batch.src.max()) < len(dm.src_vocab) and int(batch.tgt_out.max()) < len(dm.tgt_vocab)
    assert all(1 <= len(ex.src) <= 6 for ex in dm.train_examples)
    assert all(1 <= len(ex.src) <= 10 for ex in dm.val_examples + dm.test_examples)
    assert dm.max_eval_length == 10 and dm.bucket_width == 5
    has_gold = bool((train_batch.alignment >= 0).any())
    assert has_gold == (task != "tsv")


@pytest.mark.parametrize("task", TASKS[:4])
def test_synthetic_vocab_is_the_full_token_set(task):
    dm = make(task)
    dm.setup()
    src_size, tgt_size = EXPECTED_VOCAB[task]
    assert (len(dm.src_vocab), len(dm.tgt_vocab)) == (len(SPECIAL_TOKENS) + src_size, len(SPECIAL_TOKENS) + tgt_size)
    longer = generate(task, 50, (20, 30), seed=99)  # far beyond the training lengths
    items = dm.encode_examples(longer)
    assert all(UNK not in item.src and UNK not in item.tgt for item in items)


def test_tsv_vocab_comes_from_training_split_only(corpus):
    dm = make("tsv", corpus)
    dm.setup()
    assert set(dm.src_vocab.tokens) == set(SPECIAL_TOKENS) | {t for ex in dm.train_examples for t in ex.src}
    assert set(dm.tgt_vocab.tokens) == set(SPECIAL_TOKENS) | {t for ex in dm.train_examples for t in ex.tgt}


def test_tsv_splits_are_disjoint(tmp_path):
    path = tmp_path / "unique.tsv"
    path.write_text("".join(f"w{i} x{i % 3}\tv{i}\n" for i in range(200)), encoding="utf-8")
    dm = Seq2SeqDataModule(task="tsv", train_lengths=(1, 5), eval_lengths=(1, 5), bucket_width=1, train_size=150,
                           val_size=25, test_size=25, batch_size=8, seed=3, path=str(path))
    dm.setup()
    names = [{ex.tgt[0] for ex in split} for split in (dm.train_examples, dm.val_examples, dm.test_examples)]
    assert not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])
    assert [len(n) for n in names] == [150, 25, 25]


@pytest.mark.parametrize("task", TASKS)
def test_setup_is_idempotent_and_seeded(task, corpus):
    corpus = None if TASK_REGISTRY.lookup(task).generated else corpus
    dm = make(task, corpus)
    dm.setup("fit")
    val = dm.val_examples
    dm.setup("validate")
    assert dm.val_examples is val
    again = make(task, corpus)
    again.setup()
    assert again.val_examples == val and again.train_examples == dm.train_examples
    other = make(task, corpus, seed=1)
    other.setup()
    assert other.train_examples != dm.train_examples


@pytest.mark.parametrize("task", TASKS[:4])
def test_train_val_test_differ(task):
    dm = make(task, train_lengths=(5, 10), eval_lengths=(5, 10))
    dm.setup()
    assert dm.train_examples[:24] != dm.val_examples != dm.test_examples


def test_val_order_fixed_and_sorted_by_length():
    dm = make("copy")
    dm.setup()
    first = [b.src_lengths.tolist() for b in dm.val_dataloader()]
    assert first == [b.src_lengths.tolist() for b in dm.val_dataloader()]
    flat = [n for b in first for n in b]
    assert flat == sorted(flat)


@pytest.mark.parametrize("bucketing", [True, False])
def test_train_batches_cover_the_training_set(bucketing):
    dm = make("copy", length_bucketing=bucketing)
    dm.setup()
    seen = sum(len(batch) for batch in dm.train_dataloader())
    assert seen == len(dm.train_examples) == 64


def test_a_bucket_pool_of_one_batch_is_random_batches_and_larger_pools_pad_less():
    """``bucket_pool`` batches' worth of the epoch's permutation are sorted together: with 1, each batch holds
    the next ``batch_size`` examples of that permutation (random batches); larger pools leave less padding."""
    padding = {}
    for pool in (1, 2, 4, 8):
        dm = make("copy", train_lengths=(1, 30), bucket_pool=pool)
        dm.setup()
        loader = dm.train_dataloader()
        loader.batch_sampler.set_epoch(3)
        batches = list(loader.batch_sampler)
        if pool == 1:
            permutation = list(loader.batch_sampler.sampler)  # the epoch's order of every example
            blocks = [set(permutation[k:k + 8]) for k in range(0, 64, 8)]
            assert sorted(map(sorted, blocks)) == sorted(sorted(batch) for batch in batches)
        lengths = [[len(dm.train_examples[i].src) for i in batch] for batch in batches]
        padding[pool] = sum(len(b) * max(b) - sum(b) for b in lengths)  # padded source positions
    assert padding[1] > padding[2] >= padding[4] >= padding[8]


def test_make_dataloader_for_extra_lengths():
    dm = make("reverse")
    dm.setup()
    loader = dm.make_dataloader(generate("reverse", 10, (30, 35), seed=5), batch_size=4)
    batches = list(loader)
    assert sum(len(b) for b in batches) == 10
    assert all(30 <= n <= 35 for b in batches for n in b.src_lengths.tolist())


def test_reading_before_setup_says_call_setup():
    with pytest.raises(RuntimeError, match="setup"):
        make("copy").src_vocab


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"task": "shuffle"}, "copy, reverse, sort, translate, tsv"),
        ({"train_lengths": (0, 5)}, "train_lengths"),
        ({"eval_lengths": (9, 3)}, "eval_lengths"),
        ({"eval_lengths": [1]}, "eval_lengths"),
        ({"bucket_width": 0}, "bucket_width"),
        ({"batch_size": 0}, "batch_size"),
        ({"train_size": 0}, "train_size"),
        ({"val_size": -1}, "val_size"),
        ({"test_size": 1.5}, "test_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"num_symbols": 0}, "num_symbols"),
        ({"seed": "0"}, "seed"),
        ({"task": "tsv", "path": "x.tsv", "tokenizer": "sentencepiece"}, "word, char, bpe, unigram"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"path": "x.tsv"}, "dataset.path is not a setting of dataset=copy"),
        ({"task": "tsv"}, "dataset.path"),
    ],
)
def test_constructor_rejects_bad_arguments(overrides, match):
    with pytest.raises(ValueError, match=match):
        make(**{"task": "copy", **overrides})


def test_tsv_missing_file_fails_at_construction(tmp_path):
    with pytest.raises(DataError, match="not found"):
        make("tsv", tmp_path / "nope.tsv")


def test_tsv_empty_split_after_filtering_is_data_error(corpus):
    dm = make("tsv", corpus, eval_lengths=(50, 60))
    with pytest.raises(DataError, match="eval_lengths"):
        dm.setup()


class TinyModel(L.LightningModule):
    """Just enough model to drive the datamodule through Trainer.fit."""

    def __init__(self, vocab_size):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, 8)
        self.out = torch.nn.Linear(8, vocab_size)
        self.first_batches = []

    def training_step(self, batch, batch_idx):
        assert isinstance(batch, Batch)
        if batch_idx == 0:
            self.first_batches.append(batch.src.clone())
        logits = self.out(self.embed(batch.tgt_in))  # (B, T_tgt, V)
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch.tgt_out, ignore_index=0)

    def validation_step(self, batch, batch_idx):
        assert isinstance(batch, Batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_fit_reshuffles_every_epoch(tmp_path):
    dm = make("copy", train_size=256)
    dm.setup()
    model = TinyModel(len(dm.tgt_vocab))
    trainer = L.Trainer(
        max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=dm)
    assert len(model.first_batches) == 2
    first, second = model.first_batches
    assert trainer.train_dataloader.batch_sampler.sampler.epoch == 1  # Lightning's set_epoch reached it
    assert first.shape != second.shape or not torch.equal(first, second)


@pytest.mark.parametrize("task", ["copy", "tsv"])
def test_the_plain_data_and_lightnings_data_module_hold_the_same_data(task, corpus):
    """``Seq2SeqData`` (what evaluation builds) and ``Seq2SeqDataModule`` (what the Trainer gets) make the same
    splits, vocabularies and batches from the same arguments; only the module is Lightning's."""
    from attnseq.data.corpus import Seq2SeqData

    module = make(task, corpus if task == "tsv" else None)
    kwargs = dict(task=task, train_lengths=(1, 6), eval_lengths=(1, 10), bucket_width=5, train_size=64, val_size=24,
                  test_size=24, batch_size=8, seed=0, **({"path": str(corpus)} if task == "tsv" else {}))
    plain = Seq2SeqData(**kwargs)
    for data in (module, plain):
        data.setup()
    assert isinstance(module, L.LightningDataModule) and not isinstance(plain, L.LightningDataModule)
    assert module.trainer is None  # Lightning's own __init__ ran, through Seq2SeqData's super().__init__()
    for split in ("train_examples", "val_examples", "test_examples"):
        assert getattr(plain, split) == getattr(module, split)
    assert plain.src_vocab.tokens == module.src_vocab.tokens and plain.tgt_vocab.tokens == module.tgt_vocab.tokens
    for a, b in zip(plain.train_dataloader(), module.train_dataloader(), strict=True):
        assert torch.equal(a.src, b.src) and torch.equal(a.tgt_in, b.tgt_in)


def test_evaluation_imports_no_lightning():
    """What ``evaluate.py`` loads (its pipeline, a run's data rebuilt as ``Seq2SeqData``) never imports Lightning:
    seconds of a launch that evaluation does not need."""
    import ast
    import subprocess
    import sys

    code = ("import sys\n"
            "import attnseq.evaluation.pipeline\n"
            "from attnseq.data import Seq2SeqData\n"
            "data = Seq2SeqData(task='copy', train_lengths=(1, 6), eval_lengths=(1, 10), bucket_width=5,\n"
            "                   train_size=64, val_size=24, test_size=24, batch_size=8, seed=0)\n"
            "data.setup()\n"
            "next(iter(data.test_dataloader()))\n"
            "print(sorted({name.split('.')[0] for name in sys.modules}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    top_level = set(ast.literal_eval(proc.stdout))  # the list the child printed
    assert {"torch", "mlflow", "attnseq"} <= top_level
    assert not {"lightning", "pytorch_lightning"} & top_level
