"""Fixtures the command tests share with the layers whose commands they run."""

from tests.eval.conftest import ckpt_run  # noqa: F401  (a run directory with two tiny checkpoints)
from tests.serve.conftest import checkpoints, data_dir  # noqa: F401  (tiny serving checkpoints, a data directory)
