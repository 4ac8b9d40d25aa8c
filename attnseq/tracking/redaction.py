"""What never leaves the process: values of secret-named keys and credentials in URIs.

One redaction for every way out — params, tags, run names, text artifacts, the files Hydra writes
in a run's output folder, log records and the console lines attnseq prints:

- a value stored under a secret-named key (``db.password``, ``api_token``, …) is masked whole;
- any text loses URI credentials (``http://user:pw@host`` → ``http://***@host``: the userinfo up to
  the last ``@`` before the host, so a password holding ``@`` goes whole), the values in
  ``<secret-named key>=<value>`` pairs (overrides, override dir names; a sweep's ``a,b`` values
  too) and in ``<secret-named key>: <value>`` lines (masked as ``'***'``, so YAML stays YAML);
- the secret values a command was given (its config and overrides), inside ``remembering``, which
  the entry point's runtime enters (``attnseq.runtime``), are masked wherever else they appear, when
  they are at least ``MIN_SECRET_LENGTH`` characters long;
- what the process writes to its console (``RedactingStream``: Hydra's failure line, tracebacks);
- a sweep's launcher never holds them: ``secrets_to_environment`` hands them to the jobs as
  ``${oc.env:...}`` references, so ``multirun.yaml`` and submitit's pickles hold none.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import yaml

MASK = "***"
MIN_SECRET_LENGTH = 4
"""Shorter remembered values are masked only by the key and URI rules (masking every ``a`` would
mangle the text)."""

# a secret word ends a key or a part of it: ``db_password``, ``apiToken``, ``api_tokens``, not ``tokenizer``
_SECRET_WORDS = (
    r"(?i:password|passwd|pwd|secret_?key|secret|token|api_?key|access_?key|private_?key|credential)s?(?![a-z])"
)
_SECRET_KEY = re.compile(_SECRET_WORDS)
# the userinfo runs to the last ``@`` before the path (a URI's authority holds no ``/ ? #``);
# ``\:`` is how Hydra escapes a colon in the overrides it prints
_URI_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*\\?://)(?P<userinfo>[^/?#\s]+)@")
_KEY = rf"[\w.~+-]*{_SECRET_WORDS}[\w.-]*"
# key=value: the value runs to whitespace, or to a comma that starts the next key=value pair
_KEY_EQUALS_VALUE = re.compile(
    rf"(?P<key>{_KEY})(?P<sep>=)(?P<value>[^\s,]*(?:,(?![^\s,]*=)[^\s,]*)*)"
)
_KEY_COLON_VALUE = re.compile(rf"(?P<key>{_KEY})(?P<sep>:[ \t]+)(?P<value>[^\s,}}]+)")

_remembered: ContextVar[frozenset[str]] = ContextVar("attnseq_remembered_secrets", default=frozenset())
"""The secrets masked by value: set for a block by ``remembering``, back to none at its end."""


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def worth_remembering(values: Iterable[Any]) -> frozenset[str]:
    """The values, stripped of quotes, that are long enough to be masked wherever they appear."""
    kept = {str(value).strip().strip("'\"") for value in values}
    return frozenset(text for text in kept if len(text) >= MIN_SECRET_LENGTH and text != MASK)


@contextmanager
def remembering(values: Iterable[Any]) -> Iterator[None]:
    """Mask these values too, wherever they appear, until the block ends (see ``MIN_SECRET_LENGTH``)."""
    token = _remembered.set(_remembered.get() | worth_remembering(values))
    try:
        yield
    finally:
        _remembered.reset(token)


def secrets_in(node: Any, key: str = "") -> list[str]:
    """The secret values in a config tree or a list of overrides: values of secret-named keys
    (a sweep's comma-separated choices one by one) and URI credentials."""
    found: list[str] = []
    if isinstance(node, Mapping):
        for k, v in node.items():
            found += secrets_in(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, (list, tuple)):
        for item in node:
            found += secrets_in(item, key)
    elif node is not None:
        text = str(node)
        if is_secret_key(key):
            found += [text, *text.split(",")]
        for match in _KEY_EQUALS_VALUE.finditer(text):
            value = match["value"]
            found += [value, *value.split(",")]
        for match in _URI_CREDENTIALS.finditer(text):
            userinfo = match["userinfo"]
            found += [userinfo, userinfo.partition(":")[2]]
    return [value for value in found if value]


def redact_text(text: str, remembered: Iterable[str] | None = None) -> str:
    """``text`` with URI credentials, secret-named values and remembered secrets (those of
    ``remembering``, unless given) masked."""
    text = _URI_CREDENTIALS.sub(rf"\g<scheme>{MASK}@", text)
    text = _KEY_EQUALS_VALUE.sub(lambda m: f"{m['key']}{m['sep']}{MASK}" if m["value"] else m[0], text)
    text = _KEY_COLON_VALUE.sub(_colon_value, text)
    for secret in sorted(_remembered.get() if remembered is None else remembered, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def _colon_value(match: re.Match) -> str:
    if match["value"].strip("'\"") == MASK:
        return match[0]
    return f"{match['key']}{match['sep']}'{MASK}'"  # quoted: a YAML line stays YAML


def redact_document(text: str, name: str) -> str:
    """A text artifact with secrets masked; a YAML document is masked value by value, so that it
    stays valid YAML (``***`` alone would read as an alias)."""
    if name.endswith((".yaml", ".yml")):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            return redact_text(text)
        safe = redact_config(data)
        return text if safe == data else yaml.safe_dump(safe, sort_keys=False, allow_unicode=True)
    return redact_text(text)


def redact(key: str, value: Any) -> str:
    """A value safe to store as a param or tag: masked whole under a secret-named key."""
    if is_secret_key(key):
        return MASK
    return redact_text(str(value))


def redact_overrides(overrides: Iterable[str]) -> list[str]:
    """Command-line overrides with secret-named values and URI credentials masked."""
    safe = []
    for override in overrides:
        key, sep, value = override.partition("=")
        safe.append(f"{key}{sep}{redact(key, value)}" if sep else redact_text(override))
    return safe


def redact_config(node: Any, key: str = "") -> Any:
    """A config tree (dicts and lists) with every secret-named value and URI credential masked;
    strings in lists (Hydra's override lists) lose their ``key=value`` secrets too."""
    if isinstance(node, Mapping):
        return {k: redact_config(v, f"{key}.{k}" if key else str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [redact_config(v, key) for v in node]
    if isinstance(node, str) or (node is not None and is_secret_key(key)):
        return redact(key, node)
    return node


class RedactingRecords:
    """A log record factory: every record's message (and traceback text) redacted at creation,
    whatever handlers Hydra or Lightning configure later. The runtime installs it
    (``attnseq.runtime``) with its secrets, so a record made in any thread masks them."""

    def __init__(self, factory, remembered: Callable[[], Iterable[str]]) -> None:
        self.factory = factory
        self.remembered = remembered

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.factory(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's to report
            return record
        safe = redact_text(message, self.remembered())
        if safe != message:
            record.msg, record.args = safe, None
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        return record


class RedactingStream:
    """A text stream (``sys.stdout``, ``sys.stderr``) whose every write is redacted: what reaches the
    console without a log record (Hydra's ``Error executing job with overrides`` line, a printed
    traceback, an error message) masks the same secrets. The runtime installs it (``attnseq.runtime``)."""

    def __init__(self, stream: Any, remembered: Callable[[], Iterable[str]]) -> None:
        self.stream = stream
        self.remembered = remembered

    def write(self, text: str) -> int:
        self.stream.write(redact_text(text, self.remembered()) if isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, …: the stream's own
        return getattr(self.stream, name)


SECRET_ENV_PREFIX = "ATTNSEQ_SECRET_"


def secrets_to_environment(overrides: list[str]) -> tuple[list[str], dict[str, str]]:
    """A sweep's overrides with every secret replaced by an ``${oc.env:ATTNSEQ_SECRET_<n>}`` reference,
    and those variables: the values of secret-named keys (each of a sweep's choices) and URI
    credentials. A launcher writes and pickles the overrides (``multirun.yaml``, submitit's
    ``.submitit/*.pkl``); the jobs inherit the environment and resolve the references."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import QuotedString

    env: dict[str, str] = {}

    def reference(secret: str) -> str:
        name = f"{SECRET_ENV_PREFIX}{len(env)}"
        env[name] = secret
        return f"${{oc.env:{name}}}"

    parser = OverridesParser.create()
    safe = []
    for line in overrides:
        key, sep, value = line.partition("=")
        if sep and is_secret_key(key) and not key.startswith("~") and "${" not in value:
            parsed = parser.parse_overrides([line])[0]
            if not parsed.is_sweep_override():
                values = [parsed.value()]
            elif parsed.is_choice_sweep() or parsed.is_range_sweep():
                values = list(parsed.sweep_iterator())
            else:  # an interval: numbers the sweeper draws
                values = []
            if values and all(isinstance(v, (str, int, float, QuotedString)) for v in values):  # not null, lists
                texts = (v.text if isinstance(v, QuotedString) else str(v) for v in values)
                line = f"{key}={','.join(reference(text) for text in texts)}"
        line = _URI_CREDENTIALS.sub(lambda m: f"{m['scheme']}{reference(m['userinfo'])}@", line)
        safe.append(line)
    return safe, env
