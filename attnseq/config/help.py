"""``--help``: the config groups with their options (the first comment of each option's file) and
the keys of the primary config and its default options with their defaults (the yaml) and their
meaning (the typed config's field descriptions, else the comment on the key's line).

Read from the YAML files' text and the torch-free settings models: nothing heavy is imported.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
HELP_FLAGS = ("--help", "-h")


def wants_help(argv: list[str]) -> bool:
    """``--help``/``-h`` among the arguments: answered by ``config_help`` before any heavy import."""
    return any(arg in HELP_FLAGS for arg in argv)


def field_descriptions(config_name: str) -> dict[str, str]:
    """Every dotted key the typed config declares, with its description (the choices' settings included)."""
    from attnseq.attention.settings import ScorerSettings
    from attnseq.config.models import EvalConfig, TrainBase
    from attnseq.data.tasks import TASKS, DatasetKeys
    from attnseq.model.conventions import DECODER_CONVENTIONS
    from attnseq.model.encoders import ENCODER_KINDS

    found: dict[str, str] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{field.alias or name}"
            nested = _model_in(field.annotation)
            if nested is not None:
                walk(nested, f"{key}.")
            elif field.description:
                found.setdefault(key, field.description)

    if config_name == "evaluate":
        walk(EvalConfig, "")
        return found
    walk(TrainBase, "")
    for group, registry in (("encoder", ENCODER_KINDS), ("scorer", ScorerSettings.registry),
                            ("decoder", DECODER_CONVENTIONS), ("dataset", TASKS)):
        for cls in registry.values():
            walk(cls, f"{group}.")
    walk(DatasetKeys, "dataset.")
    return found


def _model_in(annotation: Any) -> type[BaseModel] | None:
    import typing

    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def config_help(config_name: str, conf_dir: Path = CONF_DIR) -> str:
    """The config groups with their options and the keys with their defaults and meaning."""
    primary = conf_dir / f"{config_name}.yaml"
    defaults = _defaults_list(primary)
    meanings = field_descriptions(config_name)
    lines = [f"python {config_name}.py [key=value ...] [group=option ...]   (-m: a sweep over a,b,c values)", ""]
    first = _leading_comment(primary)
    if first:
        lines += [first, ""]
    groups = [(group, option) for group, option in defaults if (conf_dir / group).is_dir()]
    if groups:
        lines.append("Config groups (group=option; * = the default):")
        for group, default in groups:
            lines.append(f"  {group}:")
            for path in sorted((conf_dir / group).glob("*.yaml")):
                mark = "*" if path.stem == default else " "
                lines.append(f"   {mark} {path.stem:22s} {_leading_comment(path)}".rstrip())
        lines.append("")
    keys: dict[str, tuple[str, str]] = {}  # dotted key → (default, meaning); a later file sets the default
    files = [(primary, "")] + [(path, f"{group}.") for group, default in groups if default not in (None, "null")
                               for path in _option_files(conf_dir / group, default)]
    for path, prefix in files:
        for dotted, value, comment in _keys(path, prefix):
            earlier = keys.get(dotted, ("", ""))
            keys[dotted] = (value or earlier[0], meanings.get(dotted) or comment or earlier[1])
    lines.append("Keys (key=value; the default follows the key):")
    for dotted, (value, meaning) in keys.items():
        shown = f"{dotted} = {value}" if value else f"{dotted}.*"
        lines.append(f"  {shown:38s} {meaning}".rstrip())
    lines += [
        "",
        f"Every key with its current value: python {config_name}.py --cfg job   (Hydra's own help: --hydra-help)",
    ]
    return "\n".join(lines)


_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<value>[^#]*?)\s*(?:#\s*(?P<comment>.*))?$")


def _defaults(path: Path) -> list:
    """A config file's defaults list, as YAML reads it."""
    return (yaml.safe_load(path.read_text()) or {}).get("defaults") or []


def _defaults_list(path: Path) -> list[tuple[str, str | None]]:
    """``(group, option)`` of each ``- group: option`` entry of a config's defaults list."""
    return [(group, option) for entry in _defaults(path) if isinstance(entry, dict)
            for group, option in entry.items() if not group.startswith(("override", "hydra"))]


def _leading_comment(path: Path) -> str:
    """The first comment line of a config file that is not a ``# @package`` directive."""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            if stripped:
                return ""
            continue
        text = stripped.lstrip("#").strip()
        if text and not text.startswith("@package"):
            return text
    return ""


def _option_files(group_dir: Path, option: str) -> list[Path]:
    """An option's file, after the shared files it pulls in (``- base/x@_here_``)."""
    path = group_dir / f"{option}.yaml"
    if not path.is_file():
        return []
    shared = [group_dir / f"{entry.partition('@')[0]}.yaml" for entry in _defaults(path) if isinstance(entry, str)]
    return [p for p in shared if p.is_file()] + [path]


def _keys(path: Path, prefix: str) -> list[tuple[str, str, str]]:
    """``(dotted key, default, comment)`` of each key of a file outside its ``defaults`` and ``hydra``;
    a section appears (default ``""``) only when a comment says what it is."""
    found, parents, skipping = [], [], False
    for line in path.read_text().splitlines():
        match = _KEY_LINE.match(line)
        if not match:
            continue
        depth = len(match["indent"]) // 2
        key = match["key"]
        if depth == 0:
            skipping = key in ("defaults", "hydra")
        if skipping or key.startswith("_"):
            continue
        parents = parents[:depth] + [key]
        value, meaning = match["value"].strip(), (match["comment"] or "").strip()
        if value or meaning:
            found.append((prefix + ".".join(parents), value, meaning))
    return found
