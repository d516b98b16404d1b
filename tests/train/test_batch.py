"""Only sampled action tokens reach a policy loss: observation logits get no gradient."""

from __future__ import annotations

import torch

from polyturn.algos.ppo import ppo_loss
from polyturn.rollout.types import Segment
from polyturn.train.batch import make_token_batch, policy_output, segment_advantages


def _batch(actor):
    seg = Segment()
    seg.add_context(actor.encode("<|user|>Which product?<|end|>\n<|assistant|>"))
    first = actor.encode("Action: list_tables[{}]") + [actor.stop_id]
    seg.add_action(first, [-1.0] * len(first), 0)
    seg.add_context(actor.encode("\n<|tool|>Tables: sales<|end|>\n<|assistant|>"))
    ids = actor.encode('Action: submit_answer[{"answer": 1}]') + [actor.stop_id]
    seg.add_action(ids, [-1.0] * len(ids), 1)
    return make_token_batch([(0, seg)], pad_id=actor.pad_id)


def test_observation_logits_get_no_gradient(tiny_actor):
    actor = tiny_actor
    batch = _batch(actor)
    hidden = actor.hidden_states(batch.input_ids, batch.attention_mask)[:, :-1]
    logits = actor.head(hidden).detach().requires_grad_(True)  # every position, observations included
    logp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    adv = segment_advantages(torch.tensor([[1.0, -2.0]]), batch)
    out = ppo_loss(logp, batch.old_logprobs, adv, batch.action_mask)
    out["loss"].backward()
    obs = ~batch.action_mask.bool()
    assert obs.any() and batch.action_mask.bool().any()
    assert torch.count_nonzero(logits.grad[obs]) == 0
    assert torch.count_nonzero(logits.grad[batch.action_mask.bool()]) > 0
    # policy_output computes the head at action tokens only, with the same values there.
    po = policy_output(actor, batch)
    m = batch.action_mask.bool()
    assert torch.allclose(po.logprobs[m], logp.detach()[m], atol=1e-5)
    assert torch.count_nonzero(po.logprobs[~m]) == 0


def test_turn_advantage_reaches_every_token_of_its_turn(tiny_actor):
    batch = _batch(tiny_actor)
    adv = segment_advantages(torch.tensor([[0.5, -1.5]]), batch)
    assert set(adv[batch.turn_index == 0].tolist()) == {0.5}
    assert set(adv[batch.turn_index == 1].tolist()) == {-1.5}
    assert set(adv[batch.turn_index == -1].tolist()) == {0.0}
