"""Turning a line of text into tokens: ``word`` or ``char``."""

from __future__ import annotations

import re

TOKENIZERS = ("word", "char")

# A word (letters/digits/underscore, with inner apostrophes kept: "don't", "l'homme") or a
# single punctuation mark: "Hello, world!" -> ["Hello", ",", "world", "!"].
WORD_PATTERN = re.compile(r"\w+(?:['\u2019]\w+)*|[^\w\s]")

# Character tokenisation writes a space as this visible mark (as SentencePiece does), so
# spaces stay readable on attention heatmap axes.
SPACE_TOKEN = "\u2581"


def check_tokenizer(tokenizer: str) -> str:
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; valid tokenizers: {', '.join(TOKENIZERS)}")
    return tokenizer


def tokenize(text: str, tokenizer: str = "word", lowercase: bool = True) -> list[str]:
    """Tokens of ``text``. ``char`` collapses runs of whitespace to one ``SPACE_TOKEN``."""
    check_tokenizer(tokenizer)
    if lowercase:
        text = text.lower()
    if tokenizer == "word":
        return WORD_PATTERN.findall(text)
    return [SPACE_TOKEN if c == " " else c for c in " ".join(text.split())]
