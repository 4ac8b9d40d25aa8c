"""Evaluate saved runs on longer inputs than they were trained on — not built yet.

It lands with the evaluation issue; until then this entry point says so and exits non-zero
rather than printing anything that looks like a result.
"""

import sys

if __name__ == "__main__":
    sys.exit("evaluate.py: not yet implemented (see the evaluation issue); nothing was evaluated.")
