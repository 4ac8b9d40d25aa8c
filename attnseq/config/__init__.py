"""The typed config: ``validate_train``/``validate_evaluate``/``validate_translate`` turn a composed config into a
``TrainConfig``/``EvalConfig``/``TranslateConfig`` or one ``ConfigError`` naming every problem. Torch-free."""

from attnseq.config.models import EvalConfig, TrainBase, TrainConfig, TranslateConfig, train_config_model
from attnseq.config.validate import logged_metrics, suite_spec, validate_evaluate, validate_train, validate_translate
from attnseq.problems import shown
from attnseq.registry import closest, did_you_mean

__all__ = ["EvalConfig", "TrainBase", "TrainConfig", "TranslateConfig", "closest", "did_you_mean", "logged_metrics",
           "shown", "suite_spec", "train_config_model", "validate_evaluate", "validate_train", "validate_translate"]
