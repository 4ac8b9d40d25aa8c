"""Token <-> id mapping, with the four special ids every model in attnseq relies on."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

PAD = 0
BOS = 1
EOS = 2
UNK = 3

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)

_JSON_FORMAT = "attnseq.vocabulary"
_JSON_VERSION = 1


class Vocabulary:
    """An immutable list of tokens: the four specials at ids 0-3, then the given tokens in order.

    Saved and loaded as JSON only: vocabularies come back from MLflow artifacts, and loading one
    must never unpickle arbitrary objects.
    """

    def __init__(self, tokens: Iterable[str] = ()) -> None:
        tokens = list(tokens)
        seen: set[str] = set()
        for token in tokens:
            if not isinstance(token, str) or token == "":
                raise ValueError(f"vocabulary tokens must be non-empty strings, got {token!r}")
            if token in SPECIAL_TOKENS:
                raise ValueError(
                    f"token {token!r} is a special token, which the vocabulary adds itself at ids 0-3; "
                    "remove it from the token list"
                )
            if token in seen:
                raise ValueError(f"token {token!r} appears twice; pass each token once")
            seen.add(token)
        self._tokens: tuple[str, ...] = SPECIAL_TOKENS + tuple(tokens)
        self._ids: dict[str, int] = {token: i for i, token in enumerate(self._tokens)}

    @classmethod
    def build(cls, token_sequences: Iterable[Iterable[str]], min_freq: int = 1) -> Vocabulary:
        """Vocabulary of the tokens seen at least ``min_freq`` times, most frequent first.

        Ties are broken by the token string, so the result depends only on the counts.
        Special tokens occurring in the data are skipped (they already have their ids).
        """
        if isinstance(min_freq, bool) or not isinstance(min_freq, int) or min_freq < 1:
            raise ValueError(f"min_freq must be an int >= 1, got {min_freq!r}")
        counts = Counter(token for sequence in token_sequences for token in sequence)
        kept = [t for t, c in counts.items() if c >= min_freq and t not in SPECIAL_TOKENS]
        kept.sort(key=lambda t: (-counts[t], t))
        return cls(kept)

    @property
    def tokens(self) -> list[str]:
        """All tokens in id order, specials included."""
        return list(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self._tokens == other._tokens

    def __hash__(self) -> int:
        return hash(self._tokens)

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} tokens: {list(self._tokens[:8])}{' ...' if len(self) > 8 else ''})"

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Ids of ``tokens``; a token not in the vocabulary becomes UNK."""
        return [self._ids.get(token, UNK) for token in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids``, specials included: nothing is stripped, callers decide."""
        tokens = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self._tokens):
                raise ValueError(f"id {i} is outside this vocabulary of {len(self)} tokens (ids 0..{len(self) - 1})")
            tokens.append(self._tokens[i])
        return tokens

    def to_json(self) -> str:
        return json.dumps(
            {"format": _JSON_FORMAT, "version": _JSON_VERSION, "tokens": list(self._tokens)},
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str) -> Vocabulary:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"vocabulary JSON does not parse: {error}") from error
        if not isinstance(data, dict) or data.get("format") != _JSON_FORMAT:
            raise ValueError(f"not an attnseq vocabulary: expected a JSON object with \"format\": \"{_JSON_FORMAT}\"")
        if data.get("version") != _JSON_VERSION:
            raise ValueError(f"vocabulary version {data.get('version')!r} is not supported (expected {_JSON_VERSION})")
        tokens = data.get("tokens")
        if not isinstance(tokens, list) or tuple(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"vocabulary \"tokens\" must be a list starting with {list(SPECIAL_TOKENS)}")
        return cls(tokens[len(SPECIAL_TOKENS) :])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))
