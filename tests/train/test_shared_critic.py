"""The shared critic's value loss on minibatches whose episodes are shorter than the batch's longest."""

from __future__ import annotations

import torch

from polyturn.config import CriticConfig
from polyturn.rollout.types import Episode, Segment, Turn
from polyturn.train.batch import make_token_batch
from polyturn.train.critics import SharedLearner


def _episode(actor, n_turns):
    seg = Segment()
    seg.add_context(actor.encode("<|user|>q<|end|>\n<|assistant|>"))
    turns = []
    for t in range(n_turns):
        ids = actor.encode("Action: list_tables[{}]") + [actor.stop_id]
        seg.add_action(ids, [0.0] * len(ids), t)
        seg.add_context(actor.encode("\n<|tool|>ok<|end|>\n<|assistant|>"))
        turns.append(Turn(observation="o", action="a", action_ids=ids, logprobs=[0.0] * len(ids), reward=0.0,
                          reward_terms={}, terminated=t == n_turns - 1, truncated=False, info={},
                          privileged="", features={}))
    return Episode(env_id="e", seed=0, task_id="t", question="q", level=1, ambiguous=False, key_actions=[],
                   turns=turns, segments=[seg])


def test_head_loss_on_a_shorter_minibatch(tiny_actor):
    learner = SharedLearner(tiny_actor, CriticConfig(kind="shared"))
    eps = [_episode(tiny_actor, 2), _episode(tiny_actor, 3)]
    returns = torch.tensor([[1.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])  # the full batch is 4 turns wide
    batch = make_token_batch([(i, s) for i, ep in enumerate(eps) for s in ep.segments], pad_id=tiny_actor.pad_id)
    hidden = tiny_actor.hidden_states(batch.input_ids, batch.attention_mask)
    loss, stats = learner.head_loss(eps, batch, hidden, returns, torch.zeros_like(returns))
    loss.backward()
    assert torch.isfinite(loss) and stats["losses/value_loss"] > 0
    assert any(p.grad is not None for p in learner.head.parameters())
