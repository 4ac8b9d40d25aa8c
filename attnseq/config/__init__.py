"""Config schemas: the checks every key of a composed config goes through before anything is
created (``schema``); the tables themselves live with the code that reads the keys."""

from attnseq.config.schema import (
    ABSENT,
    Check,
    absent_ok,
    check_arguments,
    check_groups,
    check_table,
    closest,
    did_you_mean,
    flag,
    length_range,
    number,
    one_of,
    optional,
    rejected,
    shown,
    text,
    texts,
    value_at,
    whole,
)

__all__ = [
    "ABSENT", "Check", "absent_ok", "check_arguments", "check_groups", "check_table", "closest", "did_you_mean",
    "flag", "length_range", "number", "one_of", "optional", "rejected", "shown", "text", "texts", "value_at",
    "whole",
]
