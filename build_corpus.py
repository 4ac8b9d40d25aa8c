"""Build the messages corpus: English → another language, from the gettext catalogs installed on
this machine (``attnseq.data.messages`` does the work; docs/messages_corpus.md has the rules).

    python build_corpus.py --lang fr          # → data/messages_en-fr/{train,val,test}.tsv, corpus.json

The entry point's process-wide effect is the signal handler: Ctrl-C or SIGTERM stops the build,
which removes its own files and leaves the corpus that was there before.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from attnseq.data.messages import DEFAULT_LOCALE_DIR, build_corpus, default_output_dir
from attnseq.errors import AttnSeqError
from attnseq.lifecycle.signals import Interrupted
from attnseq.runtime import Runtime


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python build_corpus.py",
        description="Build an English → LANG parallel corpus from the installed gettext catalogs "
        "(<locale-dir>/LANG/LC_MESSAGES/*.mo): train/val/test TSV files split by message.",
    )
    parser.add_argument("--lang", default="fr", help="the target language's locale folder name (default: fr)")
    parser.add_argument("--locale-dir", type=Path, default=DEFAULT_LOCALE_DIR,
                        help=f"where the <lang>/LC_MESSAGES folders are (default: {DEFAULT_LOCALE_DIR})")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: data/messages_en-LANG, from the working directory)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split by message (default: 0)")
    parser.add_argument("--min-words", type=int, default=1, help="fewest English words to keep a pair (default: 1)")
    parser.add_argument("--max-words", type=int, default=30, help="most English words to keep a pair (default: 30)")
    parser.add_argument("--val-fraction", type=float, default=0.05, help="share of messages for val (default: 0.05)")
    parser.add_argument("--test-fraction", type=float, default=0.05, help="share of messages for test (default: 0.05)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    with Runtime():
        try:
            build_corpus(
                args.lang, locale_dir=args.locale_dir, output_dir=args.out, seed=args.seed, min_words=args.min_words,
                max_words=args.max_words, val_fraction=args.val_fraction, test_fraction=args.test_fraction,
            )
        except AttnSeqError as error:
            print(f"error: {error}", file=sys.stderr, flush=True)
            raise SystemExit(error.exit_code) from None
        except Interrupted as interrupted:
            where = args.out if args.out is not None else default_output_dir(args.lang)
            print(f"\ninterrupted ({signal.Signals(interrupted.signum).name}): the build stopped and removed its "
                  f"files; {where} holds the corpus it held before (or this one whole, if it had just been put "
                  "in place)", file=sys.stderr, flush=True)
            raise SystemExit(interrupted.code) from None


if __name__ == "__main__":
    main()
