"""Helper of test_distributed.py (run as a script under torchrun, or :func:`learn_once` in the test's process): one
``Trainer.learn`` on a saved batch.

``python dp_learn.py CONFIG_OUT DEMOS EPISODES.pkl WEIGHTS.pt`` builds the tiny test trainer, learns once on the
pickled global batch (iteration 1: the mixed phase, so BC, PPO and the critic all step) and, on rank 0, saves the
actor's and the critic's weights.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import torch

from polyturn.config import load_config
from polyturn.train import distributed
from polyturn.train.trainer import Trainer


def learn_once(out: str, demos: str, episodes: str, weights: str) -> None:
    """One learn() on the pickled batch; rank 0 (or the only process) saves the weights."""
    distributed.setup("cpu")
    cfg = load_config(Path(__file__).parents[2] / "configs" / "test_tiny.yaml",
                      [f"run.out_dir={out}", f"bc.demos={demos}", "run.device=cpu",
                       "actor.microbatch_tokens=600", "critic.microbatch_tokens=300"])  # several micro-batches each
    tr = Trainer(cfg)
    tr.learn(1, pickle.loads(Path(episodes).read_bytes()), gen_s=1.0)
    if distributed.rank() == 0:
        torch.save({"actor": tr.actor.model.state_dict(), "critic": tr.critic.critic.state_dict()}, weights)
    distributed.close()


if __name__ == "__main__":
    learn_once(*sys.argv[1:5])
