"""Shared test settings.

Tests build tiny models: with more than one torch thread per process they spend their time in
thread hand-offs (and fight the CLI subprocesses for the two cores), so the test process uses one.
"""

import torch

torch.set_num_threads(1)
