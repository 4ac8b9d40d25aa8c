"""Translate with a trained run's model: the sources on the command line, or one per line from stdin;
one output per line on stdout. All the work is in ``attnseq.evaluation.translate``.

    python translate.py run_id=<id> "s3 s1 s4" "s0 s9"
    python translate.py run_id=latest beam_size=4 < sources.txt
    python translate.py run_id=<id> beam_size=5 n_best=3 "s3 s1 s4"   # 3 lines: 0<TAB>score<TAB>output
    python translate.py run_id=<id> heatmaps=heatmaps/ "s3 s1 s4"
    python translate.py --help                # every key with its meaning
"""

from __future__ import annotations

from attnseq.runtime import Runtime  # isort: skip  (standard library only)

runtime = Runtime()
if __name__ == "__main__":
    runtime.install()  # first, before the heavy imports (see train.py)

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from attnseq.cli import checked_command_line, config_help, overrides_and_texts, user_errors, wants_help  # noqa: E402

CONF_DIR = Path(__file__).resolve().parent / "conf"
"""The config files beside this script, wherever the package is installed."""

USAGE = '[key=value ...] ["source" ...]   (no source: one per line from stdin)'
FOOTER = ("An argument that reads as key=value is a setting; put sources that do after --. "
          "More: docs/evaluation.md#using-a-trained-model-translatepy")


def read_sources(texts: list[str]) -> list[str]:
    """The sources given on the command line, else stdin's lines (a line each)."""
    if texts:
        return texts
    if sys.stdin.isatty():
        print("Reading sources from stdin, one per line (Ctrl-D to end).", file=sys.stderr, flush=True)
    return sys.stdin.read().splitlines()


def main(argv: list[str]) -> None:
    overrides, texts = overrides_and_texts(argv)
    if wants_help(overrides):  # answered from the config file: no torch, no MLflow
        print(config_help("translate", CONF_DIR, usage=USAGE, footer=FOOTER))
        return
    (config,) = checked_command_line("translate", overrides, CONF_DIR)  # a typo fails here, before torch loads
    with user_errors():
        runtime.configure(config)
        from attnseq.config import validate_translate
        from attnseq.evaluation.translate import LATEST, translate

        cfg = validate_translate(config)
        translation = translate(cfg, read_sources(texts))
    if cfg.run_id == LATEST:
        print(f"run {translation.trained.run_id} ({translation.trained.name}), the newest finished training run",
              file=sys.stderr)
    for line in translation.warnings:
        print(line, file=sys.stderr)
    if translation.n_best:  # a line per hypothesis, best first: source number, ranking score, output
        for row, best in enumerate(translation.n_best):
            for hypothesis in best:
                print(f"{row}\t{hypothesis.score:.4f}\t{hypothesis.output}")
    else:
        for output in translation.outputs:
            print(output)
    for path in translation.heatmaps:
        print(f"heatmap: {path}", file=sys.stderr)


if __name__ == "__main__":
    with runtime:  # everything it set is undone at the exit
        main(sys.argv[1:])
