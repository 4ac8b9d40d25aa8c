"""Turning one side's text into tokens, and tokens back into text (``detokenize``).

The kinds (``dataset.tokenizer`` of a TSV corpus):

- ``word``: words (inner apostrophes kept: "don't", "l'homme") and single punctuation marks;
  detokenised by joining with spaces, so "Hello, world!" comes back as "hello , world !".
- ``char``: characters, a space written as ``SPACE_TOKEN``; detokenised by joining them.
- ``bpe``, ``unigram``: subword pieces of a Hugging Face ``tokenizers`` model trained on the
  training split (``SubwordTokenizer.train``). A Metaspace pre-tokenizer writes each space as
  ``SPACE_TOKEN`` at the start of the piece that follows it, so joining the pieces restores the
  spaces exactly. The trained model, normalisation included, is saved as the library's own JSON.

The synthetic tasks' text is symbols separated by spaces, read as written (``SYMBOLS``).

Every kind collapses runs of whitespace to one space and strips the ends; ``lowercase`` lowercases.
Tokens are strings in every kind, so vocabularies and heatmap axes treat them alike.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from attnseq.data.vocab import EOS, PAD, UNK_TOKEN, Vocabulary
from attnseq.errors import ConfigError

if TYPE_CHECKING:  # the library is imported where a subword model is made or loaded, not by every data user
    from tokenizers import Tokenizer

RULE_TOKENIZERS = ("word", "char")
SUBWORD_TOKENIZERS = ("bpe", "unigram")
TOKENIZERS = (*RULE_TOKENIZERS, *SUBWORD_TOKENIZERS)
"""The values of ``dataset.tokenizer``."""
SYMBOLS = "symbols"
"""The reading of the synthetic tasks: tokens separated by whitespace, kept as written."""

DEFAULT_VOCAB_SIZE = 2000
"""Subword pieces per side (``dataset.vocab_size``), the unknown-piece token included."""
LONGEST_PIECE = {"bpe": 32, "unigram": 16}
"""The most characters a learned piece holds (``SPACE_TOKEN`` included; the unigram trainer's own
default), so a line's length in characters bounds its pieces before any model exists. The messages
corpus's longest BPE piece is 17."""

# A word (letters/digits/underscore, with inner apostrophes kept: "don't", "l'homme") or a
# single punctuation mark: "Hello, world!" -> ["Hello", ",", "world", "!"].
WORD_PATTERN = re.compile(r"\w+(?:['\u2019]\w+)*|[^\w\s]")

# Character and subword tokens write a space as this visible mark (as SentencePiece does), so
# spaces stay readable on attention heatmap axes.
SPACE_TOKEN = "\u2581"

_ASCII_WORD = re.compile(r"[^ \t\n\r\f\v]+")  # every kind splits at these (and maybe more): a token each at least
_WHITESPACE = re.compile(r"\s+")  # Python's whitespace: at least what any kind's normaliser collapses

def check_tokenizer(tokenizer: str) -> str:
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; valid tokenizers: {', '.join(TOKENIZERS)}")
    return tokenizer


def tokenize(text: str, tokenizer: str = "word", lowercase: bool = True) -> list[str]:
    """Tokens of ``text`` by a rule (``word`` or ``char``); subwords need a trained ``SubwordTokenizer``."""
    check_tokenizer(tokenizer)
    if tokenizer in SUBWORD_TOKENIZERS:
        raise ValueError(
            f"tokenizer {tokenizer!r} is learned from a corpus: train one with SubwordTokenizer.train "
            "(the data module does, on the training split)"
        )
    if lowercase:
        text = text.lower()
    if tokenizer == "word":
        return WORD_PATTERN.findall(text)
    return [SPACE_TOKEN if c == " " else c for c in " ".join(text.split())]


def detokenize(tokens: Sequence[str], tokenizer: str) -> str:
    """The text ``tokens`` of kind ``tokenizer`` (a ``TOKENIZERS`` value or ``SYMBOLS``) stand for."""
    if tokenizer in ("word", SYMBOLS):
        return " ".join(tokens)
    if tokenizer == "char":
        return "".join(" " if token == SPACE_TOKEN else token for token in tokens)
    if tokenizer in SUBWORD_TOKENIZERS:  # as the Metaspace decoder: the first piece's space is the one it added
        text = "".join(tokens).replace(SPACE_TOKEN, " ")
        return text[1:] if text.startswith(" ") else text
    raise ValueError(f"unknown tokenizer {tokenizer!r}; valid tokenizers: {', '.join((*TOKENIZERS, SYMBOLS))}")


def surely_longer(text: str, limit: int, longest_token: int | None = None) -> bool:
    """Whether ``text`` gives more than ``limit`` tokens, told without tokenising it (a line of
    megabytes costs gigabytes in tokens): every kind gives a token at least per word between ASCII
    whitespace, and, when no token is longer than ``longest_token`` characters, one per that many
    characters that are not whitespace. False means "maybe not": tokenise to know."""
    if len(text) <= limit:
        return False  # no kind gives more tokens than characters (a subword model adds one leading space)
    if sum(1 for _ in itertools.islice(_ASCII_WORD.finditer(text), limit + 1)) > limit:
        return True
    return bool(longest_token) and len(text) > limit * longest_token and (
        len(_WHITESPACE.sub("", text)) > limit * longest_token)


class TextTokenizer(Protocol):
    """One side's reading of text: ``tokenize`` and its inverse ``detokenize``; ``longest_token``
    (characters, None if unbounded) lets ``surely_longer`` drop over-long lines before tokenising."""

    kind: str

    def tokenize(self, text: str) -> list[str]: ...

    def tokenize_all(self, texts: Sequence[str]) -> list[list[str]]: ...

    def detokenize(self, tokens: Sequence[str]) -> str: ...


@dataclass(frozen=True)
class RuleTokenizer:
    """``word``, ``char`` or ``SYMBOLS``: nothing to learn, nothing to save."""

    kind: str = "word"
    lowercase: bool = True

    def __post_init__(self) -> None:
        if self.kind not in (*RULE_TOKENIZERS, SYMBOLS):
            raise ValueError(f"a rule tokenizer is one of {', '.join((*RULE_TOKENIZERS, SYMBOLS))}, got {self.kind!r}")

    @property
    def longest_token(self) -> int | None:
        return 1 if self.kind == "char" else None

    def tokenize(self, text: str) -> list[str]:
        if self.kind == SYMBOLS:
            return text.split()
        return tokenize(text, self.kind, self.lowercase)

    def tokenize_all(self, texts: Sequence[str]) -> list[list[str]]:
        return [self.tokenize(text) for text in texts]

    def detokenize(self, tokens: Sequence[str]) -> str:
        return detokenize(tokens, self.kind)


class SubwordTokenizer:
    """A trained ``bpe`` or ``unigram`` model of Hugging Face ``tokenizers``, with its normaliser
    (whitespace, and lowercasing when asked) and Metaspace pre-tokenizer and decoder."""

    def __init__(self, model: Tokenizer) -> None:
        kind = json.loads(model.to_str())["model"]["type"].lower()
        if kind not in SUBWORD_TOKENIZERS:
            raise ValueError(f"a subword tokenizer is one of {', '.join(SUBWORD_TOKENIZERS)}, got a {kind!r} model")
        self.kind = kind
        self.model = model
        self.longest_token = max(map(len, model.get_vocab()), default=1)
        """The longest piece, in characters (an unseen character is a piece of one)."""

    @classmethod
    def train(cls, kind: str, texts: Iterable[str], vocab_size: int, lowercase: bool = True) -> SubwordTokenizer:
        """A ``kind`` model of at most ``vocab_size`` pieces (``UNK_TOKEN`` included) learned from
        ``texts``. The same texts give the same pieces and segment alike; a ``bpe`` model's JSON is
        the same byte for byte, while the unigram trainer of ``tokenizers`` 0.23 lists a few rare
        characters at the end in an order (and with scores 1e-4 apart) that varies between processes.

        Raises:
            ConfigError: ``vocab_size`` cannot hold every character of ``texts`` plus ``UNK_TOKEN``.
        """
        from tokenizers import trainers

        if kind not in SUBWORD_TOKENIZERS:
            raise ValueError(f"a subword tokenizer is one of {', '.join(SUBWORD_TOKENIZERS)}, got {kind!r}")
        texts = list(texts)
        tokenizer = _untrained(kind, lowercase)
        _check_vocab_size(tokenizer, texts, vocab_size)
        if kind == "bpe":
            trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[UNK_TOKEN], show_progress=False,
                                          max_token_length=LONGEST_PIECE[kind])
        else:
            trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=[UNK_TOKEN], unk_token=UNK_TOKEN,
                                              show_progress=False, max_piece_length=LONGEST_PIECE[kind])
        tokenizer.train_from_iterator(texts, trainer)
        return cls(tokenizer)

    def tokenize(self, text: str) -> list[str]:
        return self.tokenize_all([text])[0]

    def tokenize_all(self, texts: Sequence[str]) -> list[list[str]]:
        """Each text's pieces. A character the model never saw is kept as itself (BPE would write
        ``UNK_TOKEN``), so detokenising gives the text back whole; the vocabulary maps it to UNK."""
        normalized = [self.model.normalizer.normalize_str(text) for text in texts]
        return [
            [text[start:end] if piece == UNK_TOKEN else piece for piece, (start, end) in zip(e.tokens, e.offsets)]
            for text, e in zip(normalized, self.model.encode_batch(normalized), strict=True)
        ]

    def detokenize(self, tokens: Sequence[str]) -> str:
        return detokenize(tokens, self.kind)

    def to_json(self) -> str:
        """The model as ``tokenizers`` saves it (``Tokenizer.to_str``): loadable without attnseq."""
        return self.model.to_str()

    @classmethod
    def from_json(cls, text: str) -> SubwordTokenizer:
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_str(text))
        except Exception as error:  # noqa: BLE001 - the library raises a bare Exception on bad JSON
            raise ValueError(f"not a saved Hugging Face tokenizer: {error}") from None


def _untrained(kind: str, lowercase: bool) -> Tokenizer:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    model = models.BPE(unk_token=UNK_TOKEN) if kind == "bpe" else models.Unigram()
    tokenizer = Tokenizer(model)
    steps = [normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    tokenizer.normalizer = normalizers.Sequence(steps + ([normalizers.Lowercase()] if lowercase else []))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_TOKEN, prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE_TOKEN, prepend_scheme="always")
    return tokenizer


def _check_vocab_size(tokenizer: Tokenizer, texts: list[str], vocab_size: int) -> None:
    """Every character of the normalised text (a space as ``SPACE_TOKEN``) needs a piece, and so
    does ``UNK_TOKEN``: unigram training fails below that, and BPE would exceed ``vocab_size``."""
    characters = {SPACE_TOKEN}
    for text in texts:
        characters.update(tokenizer.normalizer.normalize_str(text).replace(" ", SPACE_TOKEN))
    needed = len(characters) + 1
    if vocab_size < needed:
        raise ConfigError(
            f"dataset.vocab_size={vocab_size} cannot hold the {len(characters)} distinct characters of the "
            f"training text and the unknown-piece token {UNK_TOKEN}.",
            f"set dataset.vocab_size to at least {needed} (subword vocabularies of a few thousand are usual).",
        )



def output_text(ids: Sequence[int], vocab: Vocabulary, tokenizer: TextTokenizer) -> str:
    """The text a model output stands for: its tokens before the first EOS (padding dropped), detokenised."""
    ids = [int(i) for i in ids]
    ids = ids[: ids.index(EOS)] if EOS in ids else [i for i in ids if i != PAD]
    return tokenizer.detokenize(vocab.decode(ids))
