"""The metrics a run logs, named from the registered metrics (``attnseq.metrics.suite``) and its
config: what ``checkpoint.monitor`` and ``optimized_metric`` may name."""

from __future__ import annotations

from attnseq.attention import NO_ATTENTION, import_plugins
from attnseq.data.tasks import TASKS
from attnseq.metrics.suite import SuiteSpec, names


def suite_spec(cfg, stage: str) -> SuiteSpec:
    """What ``stage`` (val, test, train) of the run ``cfg`` describes can measure."""
    dataset = cfg.dataset
    lo, hi = dataset.train_lengths
    return SuiteSpec(
        stage,
        max_length=int(dataset.eval_lengths[1]),
        bucket_width=int(dataset.bucket_width),
        train_lengths=(int(lo), int(hi)),
        attention=cfg.scorer.name != NO_ATTENTION,
        gold_alignment=TASKS.lookup(dataset.task).has_gold_alignment,
        text=TASKS.lookup(dataset.task).is_text,
    )


def logged_metrics(cfg, stage: str = "val") -> list[str]:
    """The epoch metrics ``Seq2SeqLitModule`` logs for ``cfg`` in ``stage`` (val or test), then the
    training ones (``train/loss``, ``train/padding_fraction``: the last two). The plugins are
    imported first, so that the metrics they define are named too."""
    import_plugins(getattr(cfg, "plugins", None) or ())
    return names(suite_spec(cfg, stage)) + names(suite_spec(cfg, "train"))
