"""``Seq2SeqData``: the train/val/test data of one run, built from plain config values, and its
dataloaders. It needs no Lightning: training hands it to the Trainer as ``Seq2SeqDataModule``
(``attnseq.data.datamodule``), evaluation builds it alone (``evaluate.py`` imports no Lightning).

Data and seeds:
- Synthetic tasks generate train, val and test with seeds ``3*seed``, ``3*seed + 1`` and
  ``3*seed + 2``: the three sets differ, and no run's validation set is another seed's training
  set. Validation and test use ``eval_lengths`` (which may reach past ``train_lengths``), and
  the validation set is the same every epoch. Vocabularies are the task's full token set, so
  evaluation at any length never meets UNK.
- ``tsv`` reads ``path``: a file, split with ``split_examples`` in the proportions
  ``train_size : val_size : test_size`` (seed ``seed``), or a folder of ready splits
  (``train.tsv``, ``val.tsv``, ``test.tsv``). A ``bpe``/``unigram`` tokenizer per side is trained
  on the training split's text (``vocab_size`` pieces), unless trained ones are passed in
  (``text_tokenizers``: evaluating a run). Each split keeps its examples whose source length (in
  tokens) lies in its range, capped at its size. Vocabularies come from the kept training
  examples only.

``setup()`` must run before the vocabularies or examples are read (the model needs the vocab
sizes); it builds everything once and does nothing on later calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader, DistributedSampler

from attnseq.data.batch import collate
from attnseq.data.errors import DataError
from attnseq.data.example import EncodedExample, Example, encode_examples
from attnseq.data.lengths import filter_by_source_length, is_int
from attnseq.data.sampler import LengthBucketBatchSampler, TokenBudgetBatchSampler, example_size
from attnseq.data.splits import split_examples
from attnseq.data.tasks import TASKS, DatasetKeys, Task, dataset_model, generate, tokenizer_for
from attnseq.data.tokenizers import (
    LONGEST_PIECE,
    SUBWORD_TOKENIZERS,
    RuleTokenizer,
    SubwordTokenizer,
    TextTokenizer,
    surely_longer,
)
from attnseq.data.tsv import TextPair, read_pairs, read_split_folder, split_files
from attnseq.data.vocab import Vocabulary
from attnseq.errors import ConfigError
from attnseq.problems import validated

DATA_TASKS = TASKS


class Seq2SeqData:
    """Train/val/test dataloaders of ``Batch`` for a synthetic task or a TSV corpus.

    Its arguments are a ``conf/dataset/<task>.yaml`` (the task's settings model checks them:
    ``attnseq.data.tasks``), plus ``seed`` and ``text_tokenizers``:

        task: a registered task (``attnseq.data.tasks.TASKS``).
        train_lengths: inclusive [lo, hi] source-length range of the training set.
        eval_lengths: inclusive [lo, hi] range of validation and test (may exceed training).
        bucket_width: width of the length buckets the metrics report; stored, not used here.
        train_size, val_size, test_size: examples per split (for tsv: proportions and caps).
        batch_size: examples per batch; with ``batch_type="token"`` the most padded positions per batch.
        batch_type: ``sentence`` (examples) or ``token``: train, val and test batches of similar size whose
            padded size stays within ``batch_size`` (``TokenBudgetBatchSampler``). Needs ``length_bucketing``.
        seed: fixes the data (see the module docstring) and the training batch order.
        num_symbols: alphabet size of copy/reverse/sort; ignored by translate and tsv.
        path: the TSV file, or a folder of train.tsv, val.tsv and test.tsv (tsv only).
        tokenizer, lowercase: how TSV text is tokenised (word, char, bpe or unigram).
        vocab_size: subword pieces per side (bpe, unigram).
        num_workers: DataLoader worker processes.
        length_bucketing: batch training examples of similar length (evaluation always is).
        bucket_pool: how many batches' worth of shuffled training examples are sorted together (the sampler's
            ``chunk_batches``).
        text_tokenizers: (source, target) tokenizers to use instead of training new ones.
    """

    def __init__(self, *, seed: int, text_tokenizers: tuple[TextTokenizer, TextTokenizer] | None = None,
                 **dataset: object) -> None:
        super().__init__()
        if not is_int(seed):
            raise ValueError(f"seed must be an int, got {seed!r}")
        task_class = TASKS.lookup(dataset.get("task"))
        dataset = {key: list(value) if isinstance(value, tuple) else value for key, value in dataset.items()}
        checked = validated(dataset_model(task_class), dataset, prefix="dataset")  # every key, typed
        self.spec: Task = task_class.model_validate(checked.model_dump(exclude=set(DatasetKeys.model_fields)))
        """The task with its own settings (a class the registry holds: it pickles)."""
        for key, value in checked:
            setattr(self, key, tuple(value) if key.endswith("_lengths") else value)
        self.seed = seed
        self.text_tokenizers = text_tokenizers
        self.path = getattr(checked, "path", None)
        self.batch_tokens = self.batch_size if self.batch_type == "token" else None
        """Token batching's budget (``batch_size`` counted in padded positions), or None."""
        if self.batch_tokens is not None and not self.length_bucketing:
            raise ConfigError(
                "dataset.batch_type=token packs examples of similar length, and dataset.length_bucketing=false "
                "asks for batches of any lengths.",
                "drop one of them: dataset.length_bucketing=true, or dataset.batch_type=sentence.",
            )
        if not task_class.generated:
            if not Path(self.path).exists():
                raise DataError(
                    self.path, "file not found",
                    "check the path; prefer an absolute one (Hydra may change the working dir)",
                )
            if Path(self.path).is_dir():
                split_files(self.path)

        self._src_vocab: Vocabulary | None = None
        self._tgt_vocab: Vocabulary | None = None
        self._src_tokenizer: TextTokenizer | None = None
        self._tgt_tokenizer: TextTokenizer | None = None
        self._examples: dict[str, list[Example]] = {}
        self._encoded: dict[str, list[EncodedExample]] = {}

    # ---- building -------------------------------------------------------------------------

    def setup(self, stage: str | None = None) -> None:
        """Build vocabularies and all three splits (once; later calls return at once)."""
        if self._examples:
            return
        if not self.spec.generated:
            examples, src_vocab, tgt_vocab = self._build_tsv()
        else:
            examples, src_vocab, tgt_vocab = self._build_synthetic()
            self._src_tokenizer = self._tgt_tokenizer = tokenizer_for({"task": self.task})
        encoded = {split: encode_examples(exs, src_vocab, tgt_vocab) for split, exs in examples.items()}
        self._check_token_budget(encoded)
        self._src_vocab, self._tgt_vocab = src_vocab, tgt_vocab
        self._examples, self._encoded = examples, encoded

    def _check_token_budget(self, encoded: dict[str, list[EncodedExample]]) -> None:
        """Token batching's budget holds the largest example of every split (a batch holds one at least)."""
        if self.batch_tokens is None:
            return
        largest = {split: max((example_size(len(x.src), len(x.tgt)) for x in items), default=0)
                   for split, items in encoded.items()}
        split = max(largest, key=largest.get)
        if largest[split] > self.batch_tokens:
            raise ConfigError(
                f"dataset.batch_size={self.batch_tokens} with dataset.batch_type=token is smaller than the largest "
                f"{split} example: {largest[split]} padded positions (max(source, target + 1)), and a batch holds "
                "one example at least.",
                f"raise it to at least {largest[split]}, e.g. dataset.batch_size={max(largest[split], 1024)}, "
                "or shorten the lengths.",
            )

    def _build_synthetic(self) -> tuple[dict[str, list[Example]], Vocabulary, Vocabulary]:
        spec = self.spec
        examples = {
            "train": generate(spec, self.train_size, self.train_lengths, 3 * self.seed),
            "val": generate(spec, self.val_size, self.eval_lengths, 3 * self.seed + 1),
            "test": generate(spec, self.test_size, self.eval_lengths, 3 * self.seed + 2),
        }
        return examples, Vocabulary(spec.source_tokens()), Vocabulary(spec.target_tokens())

    def _build_tsv(self) -> tuple[dict[str, list[Example]], Vocabulary, Vocabulary]:
        sizes = {"train": self.train_size, "val": self.val_size, "test": self.test_size}
        if Path(self.path).is_dir():
            pairs = read_split_folder(self.path)
        else:
            corpus = read_pairs(self.path)
            total = sum(sizes.values())
            pairs = dict(zip(sizes, split_examples(corpus, [size / total for size in sizes.values()], seed=self.seed)))
        # A pair whose source is surely longer than any split keeps is dropped before tokenising (and
        # before subword training): a line of megabytes would cost gigabytes in tokens.
        longest = max(self.train_lengths[1], self.eval_lengths[1])
        learned_from = [pair for pair in pairs["train"]
                        if not surely_longer(pair.source, longest, LONGEST_PIECE.get(self.tokenizer))]
        self._src_tokenizer, self._tgt_tokenizer = self.text_tokenizers or self._train_tokenizers(learned_from)
        longest_token = getattr(self._src_tokenizer, "longest_token", None)
        examples = {}
        for split, size in sizes.items():
            lengths = self.train_lengths if split == "train" else self.eval_lengths
            short = [pair for pair in pairs[split] if not surely_longer(pair.source, lengths[1], longest_token)]
            kept = filter_by_source_length(self._tokenized(short), lengths)[:size]
            if not kept:
                read = f"{len(pairs[split])} pairs in this split" + (
                    "" if Path(self.path).is_dir() else " of the corpus")
                raise DataError(
                    self.path,
                    f"the {split} split has no pair with source length in {list(lengths)} ({read}, "
                    f"source lengths counted in {self.tokenizer} tokens)",
                    f"widen {'train_lengths' if split == 'train' else 'eval_lengths'}, raise {split}_size, "
                    "or use a bigger corpus",
                )
            examples[split] = kept
        train = examples["train"]
        return examples, Vocabulary.build(ex.src for ex in train), Vocabulary.build(ex.tgt for ex in train)

    def _train_tokenizers(self, train: list[TextPair]) -> tuple[TextTokenizer, TextTokenizer]:
        """(source, target) tokenizers: by rule, or learned from the training split's text alone."""
        if self.tokenizer not in SUBWORD_TOKENIZERS:
            reading = RuleTokenizer(self.tokenizer, self.lowercase)
            return reading, reading
        return tuple(
            SubwordTokenizer.train(self.tokenizer, texts, self.vocab_size, self.lowercase)
            for texts in ([pair.source for pair in train], [pair.target for pair in train])
        )

    def _tokenized(self, pairs: list[TextPair]) -> list[Example]:
        sources = self._src_tokenizer.tokenize_all([pair.source for pair in pairs])
        targets = self._tgt_tokenizer.tokenize_all([pair.target for pair in pairs])
        return [Example(src, tgt, None) for src, tgt in zip(sources, targets, strict=True)]

    def _require_setup(self, name: str) -> None:
        if not self._examples:
            raise RuntimeError(f"Seq2SeqDataModule.{name} is built by setup(); call datamodule.setup() first")

    # ---- what the rest of attnseq reads --------------------------------------------------

    @property
    def src_vocab(self) -> Vocabulary:
        self._require_setup("src_vocab")
        return self._src_vocab

    @property
    def tgt_vocab(self) -> Vocabulary:
        self._require_setup("tgt_vocab")
        return self._tgt_vocab

    @property
    def src_tokenizer(self) -> TextTokenizer:
        """How source text becomes tokens (the synthetic tasks: symbols separated by spaces)."""
        self._require_setup("src_tokenizer")
        return self._src_tokenizer

    @property
    def tgt_tokenizer(self) -> TextTokenizer:
        """How target text becomes tokens, and output tokens text again (``detokenize``)."""
        self._require_setup("tgt_tokenizer")
        return self._tgt_tokenizer

    @property
    def train_examples(self) -> list[Example]:
        self._require_setup("train_examples")
        return self._examples["train"]

    @property
    def val_examples(self) -> list[Example]:
        self._require_setup("val_examples")
        return self._examples["val"]

    @property
    def test_examples(self) -> list[Example]:
        self._require_setup("test_examples")
        return self._examples["test"]

    @property
    def max_eval_length(self) -> int:
        """The longest source length evaluated (the upper end of ``eval_lengths``)."""
        return self.eval_lengths[1]

    def encode_examples(self, examples: Sequence[Example]) -> list[EncodedExample]:
        """Examples mapped to ids with this module's vocabularies (unknown tokens -> UNK)."""
        self._require_setup("encode_examples")
        return encode_examples(examples, self._src_vocab, self._tgt_vocab)

    # ---- dataloaders ------------------------------------------------------------------------

    def _loader(self, items: list[EncodedExample], batch_size: int, shuffle: bool, bucketing: bool,
                tokens: int | None = None) -> DataLoader:
        """Batches of ``batch_size`` examples, or of at most ``tokens`` padded positions when given."""
        replicas, rank = self._replicas()
        if tokens is not None:
            sampler = TokenBudgetBatchSampler(
                [example_size(len(x.src), len(x.tgt)) for x in items], tokens,
                shuffle=shuffle, seed=self.seed, num_replicas=replicas, rank=rank,
            )
            return DataLoader(items, batch_sampler=sampler, collate_fn=collate, num_workers=self.num_workers)
        if bucketing:
            sampler = LengthBucketBatchSampler(
                [len(x.src) for x in items], batch_size, shuffle=shuffle, seed=self.seed,
                chunk_batches=self.bucket_pool, num_replicas=replicas, rank=rank,
            )
            return DataLoader(items, batch_sampler=sampler, collate_fn=collate, num_workers=self.num_workers)
        if replicas > 1:
            shard = DistributedSampler(items, replicas, rank, shuffle=shuffle, seed=self.seed, drop_last=shuffle)
            return DataLoader(
                items, batch_size=batch_size, sampler=shard, collate_fn=collate, num_workers=self.num_workers
            )
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            items, batch_size=batch_size, shuffle=shuffle, generator=generator,
            collate_fn=collate, num_workers=self.num_workers,
        )

    def _replicas(self) -> tuple[int, int]:
        """(processes, this one's rank) the loaders shard over: one, alone (``Seq2SeqDataModule`` asks its Trainer)."""
        return 1, 0

    def train_dataloader(self) -> DataLoader:
        self._require_setup("train_dataloader")
        return self._loader(self._encoded["train"], self.batch_size, shuffle=True, bucketing=self.length_bucketing,
                            tokens=self.batch_tokens)

    def val_dataloader(self) -> DataLoader:
        """Always in one fixed order, sorted by source length (``length_bucketing`` is for training)."""
        self._require_setup("val_dataloader")
        return self._loader(self._encoded["val"], self.batch_size, shuffle=False, bucketing=True,
                            tokens=self.batch_tokens)

    def test_dataloader(self) -> DataLoader:
        self._require_setup("test_dataloader")
        return self._loader(self._encoded["test"], self.batch_size, shuffle=False, bucketing=True,
                            tokens=self.batch_tokens)

    def make_dataloader(self, examples: Sequence[Example], batch_size: int, shuffle: bool = False) -> DataLoader:
        """A dataloader over extra examples (e.g. another length range), length-grouped."""
        if not is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
        return self._loader(self.encode_examples(examples), batch_size, shuffle=shuffle, bucketing=True)
