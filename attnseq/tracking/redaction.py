"""What never reaches a tracking store: values of secret-named keys and credentials in URIs."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"

_URI_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^@/]+)@")
_SECRET_KEY = re.compile(r"(password|passwd|secret|token|api_key|access_key|credential)", re.IGNORECASE)


def redact(key: str, value: Any) -> str:
    """A value safe to store as a param or tag: no credentials from URIs, no secret-named keys."""
    if _SECRET_KEY.search(key):
        return MASK
    return _URI_CREDENTIALS.sub(rf"\g<scheme>{MASK}@", str(value))


def redact_overrides(overrides: Iterable[str]) -> list[str]:
    """Command-line overrides with secret-named values and URI credentials masked."""
    safe = []
    for override in overrides:
        key, sep, value = override.partition("=")
        safe.append(f"{key}{sep}{redact(key, value)}" if sep else redact("", override))
    return safe


def redact_config(node: Any, key: str = "") -> Any:
    """A resolved config (dicts and lists) with every secret-named value and URI credential masked."""
    if isinstance(node, Mapping):
        return {k: redact_config(v, f"{key}.{k}" if key else str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [redact_config(v, key) for v in node]
    if isinstance(node, str) or _SECRET_KEY.search(key):
        return redact(key, node)
    return node
