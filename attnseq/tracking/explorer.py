"""The attention explorer: one self-contained HTML page (inline CSS, plain JavaScript drawing inline SVG, the
data as inline JSON; nothing fetched, so it opens from MLflow's artifact view and from disk alike).

Pick a sample, an epoch (a training run's), an attention map (the cross-attention, or a Transformer's
encoder or decoder self-attention of one layer) and a head (or the mean over heads); hover a cell for the
tokens and the weight. The gold source position (where the task has one) is circled, each row's argmax
crossed; beside the cross-attention, the same step's importance by each measure (gradient × input,
integrated gradients, leave-one-out; each row scaled to its maximum), with each step's Kendall τ against
the attention. The data: ``attnseq.faithfulness.explorer.explorer_samples``' entries, per epoch.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from importlib import resources

__all__ = ["DATA_ID", "comparison_explorer_html", "explorer_data", "explorer_html"]

DATA_ID = "explorer-data"
"""The id of the ``<script type="application/json">`` element holding the page's data."""

MEASURE_NAMES = {"grad_x_input": "gradient × input", "integrated_gradients": "integrated gradients",
                 "leave_one_out": "leave-one-out"}


def explorer_html(title: str, epochs: Sequence[dict], note: str = "") -> str:
    """The page. ``epochs``: ``{"label": "epoch 3", "samples": [explorer_samples' entries]}``, oldest first;
    the last is shown first. ``note``: a line under the title (what was evaluated, how it decoded)."""
    return _page(title, {"title": title, "note": note, "epochs": list(epochs), "measure_names": MEASURE_NAMES})


def _page(title: str, data: dict) -> str:
    payload = json.dumps(data, ensure_ascii=False, allow_nan=False).replace("</", "<\\/")  # no early </script>
    return (PAGE.replace("__TITLE__", html.escape(title)).replace("__DATA_ID__", DATA_ID)
            .replace("__DATA__", payload))


def comparison_explorer_html(title: str, runs: Sequence[str], samples: Sequence[dict], note: str = "") -> str:
    """A comparison's page: the same samples as each run attends to them, two runs side by side with their
    difference and each step's Jensen–Shannon divergence. ``samples``: ``{"label", "source", "rows"`` (the
    steps' target tokens), ``"gold"`` (or None), ``"attention"``: per run ``(T, T_src)`` (mean over heads)``}``."""
    data = {"title": title, "note": note, "epochs": [], "measure_names": MEASURE_NAMES,
            "compare": {"runs": list(runs), "samples": list(samples)}}
    return _page(title, data)


def explorer_data(page: str) -> dict:
    """The data ``explorer_html`` put into ``page``, read back (what a script or a test checks)."""
    [payload] = re.findall(rf'<script type="application/json" id="{DATA_ID}">(.*?)</script>', page, re.S)
    return json.loads(payload.replace("<\\/", "</"))


PAGE = (resources.files(__package__) / "explorer.html").read_text(encoding="utf-8")
"""The page's template (``explorer.html`` beside this module): ``__TITLE__``, ``__DATA_ID__`` and ``__DATA__``
are filled in."""
