"""``--help``: the config groups with their options (the first comment of each option's file), and the
keys of the primary config and its default options with their defaults (the yaml) and meaning (the
typed config's field descriptions, else the comment on the key's line). Reads the YAML files' text and
the torch-free settings models: nothing heavy is imported."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
HELP_FLAGS = ("--help", "-h")
_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<value>[^#]*?)\s*(?:#\s*(?P<comment>.*))?$")


def wants_help(argv: list[str]) -> bool:
    return any(arg in HELP_FLAGS for arg in argv)


def field_descriptions(config_name: str) -> dict[str, str]:
    """Every dotted key the typed config declares, with its description (every registered choice's included)."""
    from attnseq.config.models import EvalConfig, TranslateConfig, train_config_model
    from attnseq.problems import models_in

    found: dict[str, str] = {}

    def walk(model: type, prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{field.alias or name}"
            for nested in models_in(field.annotation):  # a group, or each choice of a union
                walk(nested, f"{key}.")
            if field.description:
                found.setdefault(key, field.description)

    walk({"evaluate": EvalConfig, "translate": TranslateConfig}.get(config_name) or train_config_model(), "")
    return found


def config_help(config_name: str, conf_dir: Path = CONF_DIR, usage: str | None = None,
                footer: str | None = None, argv: list[str] | tuple[str, ...] = ()) -> str:
    """The config groups with their options and the keys with their defaults and meaning; ``usage``
    and ``footer``: a command's own first and last lines (one that is no Hydra app: ``translate.py``).
    A ``group=option`` in ``argv`` (``decoder=transformer``, ``lr_schedule=noam``, ``experiment=…``) lists
    that option's keys instead of the default's, with the options it overrides in turn."""
    primary = conf_dir / f"{config_name}.yaml"
    meanings = field_descriptions(config_name)
    groups = [(group, option) for entry in _defaults(primary) if isinstance(entry, dict)
              for group, option in entry.items() if not group.startswith(("override", "hydra"))
              and (conf_dir / group).is_dir()]
    usage = usage or ("[key=value ...] [group=option ...]   (-m: a sweep over a,b,c values)" if groups
                      else "[key=value ...]")
    lines = [f"python {config_name}.py {usage}", ""]
    lines += [_leading_block(primary), ""] if _leading_block(primary) else []
    if groups:
        lines.append("Config groups (group=option; * = the default):")
        for group, default in groups:
            lines.append(f"  {group}:")
            lines += [f"   {'*' if path.stem == default else ' '} {path.stem:22s} {meaning.strip()}".rstrip()
                      for path in sorted((conf_dir / group).glob("*.yaml"))  # an option's meaning: its first line
                      for meaning in [_leading_block(path).partition("\n")[0]]]
        lines.append("")
    keys: dict[str, tuple[str, str]] = {}  # dotted key → (default, meaning); a later file sets the default
    chosen = _chosen_options(groups, argv, conf_dir)
    files = [(primary, "")] + [(path, _package_prefix(path, group)) for group, option in chosen.items()
                               if option not in (None, "null") for path in _option_files(conf_dir / group, option)]
    for path, prefix in files:
        for dotted, value, comment in _keys(path, prefix):
            earlier = keys.get(dotted, ("", ""))
            keys[dotted] = (value or earlier[0], meanings.get(dotted) or comment or earlier[1])
    picked = " ".join(f"{group}={option}" for (group, default), option in zip(groups, chosen.values())
                      if option != default)
    lines.append(f"Keys (key=value; the default follows the key{f', with {picked}' if picked else ''}):")
    lines += [f"  {f'{dotted} = {value}' if value else f'{dotted}.*':38s} {meaning}".rstrip()
              for dotted, (value, meaning) in keys.items()]
    footer = footer or (f"Every key with its current value: python {config_name}.py --cfg job   "
                        "(Hydra's own help: --hydra-help)" + (f"\nAn option's own keys: python {config_name}.py "
                                                             "<group>=<option> --help" if groups else ""))
    return "\n".join([*lines, "", footer])


def _chosen_options(groups: list[tuple[str, str]], argv, conf_dir: Path) -> dict[str, str]:
    """Each group's option, in the defaults' order: the default, unless ``argv`` names another
    (``group=option`` with a conf/group/option.yaml) or a named option's ``override /group: option``
    does (``experiment=joey_reverse``, ``decoder=transformer``'s scorer); the command line wins, as in Hydra."""
    chosen = dict(groups)
    given = {}
    for arg in argv:
        group, sep, option = arg.partition("=")
        if sep and group in chosen and (conf_dir / group / f"{option}.yaml").is_file():
            given[group] = option
    for group, option in given.items():
        for entry in _defaults(conf_dir / group / f"{option}.yaml"):
            for target, value in (entry.items() if isinstance(entry, dict) else ()):
                overridden = re.fullmatch(r"override /(\w+)(?:@\S+)?", str(target))
                if overridden and overridden[1] in chosen and overridden[1] not in given:
                    chosen[overridden[1]] = str(value)
    return chosen | given


def _defaults(path: Path) -> list:
    return (yaml.safe_load(path.read_text()) or {}).get("defaults") or []


def _leading_block(path: Path) -> str:
    """The comment lines a config file opens with (a command's usage examples, an option's meaning), ``# @package``
    left out."""
    block = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line[1:].removeprefix(" ").rstrip()
        if not text.lstrip().startswith("@package"):
            block.append(text)
    return "\n".join(block).strip("\n")


def _package_prefix(path: Path, group: str) -> str:
    """Where an option file's keys land: ``group.``, or the root for ``# @package _global_``."""
    header = re.match(r"#\s*@package\s+(\S+)", path.read_text())
    return "" if header and header[1] == "_global_" else f"{group}."


def _option_files(group_dir: Path, option: str) -> list[Path]:
    """An option's file, after the shared files it pulls in (``- base/x@_here_``)."""
    path = group_dir / f"{option}.yaml"
    shared = [group_dir / f"{entry.partition('@')[0]}.yaml" for entry in _defaults(path) if isinstance(entry, str)] \
        if path.is_file() else []
    return [p for p in shared if p.is_file()] + [path] * path.is_file()


def _keys(path: Path, prefix: str) -> list[tuple[str, str, str]]:
    """``(dotted key, default, comment)`` of each key of a file outside its ``defaults`` and ``hydra``;
    a section appears (default ``""``) only when a comment says what it is."""
    found, parents, skipping = [], [], False
    for match in filter(None, map(_KEY_LINE.match, path.read_text().splitlines())):
        depth, key = len(match["indent"]) // 2, match["key"]
        skipping = key in ("defaults", "hydra") if depth == 0 else skipping
        if skipping or key.startswith("_"):
            continue
        parents = parents[:depth] + [key]
        value, meaning = match["value"].strip(), (match["comment"] or "").strip()
        if value or meaning:
            found.append((prefix + ".".join(parents), value, meaning))
    return found
