"""The critic learners' one interface, and a target network only where TD targets read it."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.testing import assert_close

from polyturn.algos import turn_gae
from polyturn.config import CriticConfig
from polyturn.models.critic import build_separate_critic
from polyturn.train.batch import make_token_batch
from polyturn.train.constraints import cost_episodes
from polyturn.train.critics import NoCritic, SeparateLearner, SharedLearner, turn_tensors


def _separate(tiny_tokenizer, **cfg) -> SeparateLearner:
    critic = build_separate_critic(encoder="scratch", tokenizer=tiny_tokenizer, hidden=32, layers=1, heads=4,
                                   max_len=128)
    return SeparateLearner(critic, CriticConfig(**cfg))


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_gae_targets_keep_no_target_network(tmp_path, tiny_actor, tiny_tokenizer, make_episodes):
    learner = _separate(tiny_tokenizer, target="gae", minibatch=4, epochs=1)
    assert learner.target is None
    eps = make_episodes(tiny_actor)
    values, _ = learner.values(eps)
    learner.update(eps, torch.ones_like(values), values, gamma=0.9)
    learner.save(tmp_path)
    assert (tmp_path / "critic").is_dir() and not (tmp_path / "critic_target").exists()
    assert not (tmp_path / "replay.pt").exists()


def test_td_target_network_is_updated_saved_and_restored_exactly(tmp_path, tiny_actor, tiny_tokenizer, make_episodes):
    learner = _separate(tiny_tokenizer, target="td", minibatch=4, epochs=2, tau=0.5)
    before = _state(learner.target)
    eps = make_episodes(tiny_actor)
    learner.update(eps, torch.zeros(3, 3), torch.zeros(3, 3), gamma=0.9)
    after = _state(learner.target)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # Polyak-averaged toward the critic
    assert any(not torch.equal(after[k], v) for k, v in learner.critic.state_dict().items())  # not a copy
    learner.save(tmp_path)
    other = _separate(tiny_tokenizer, target="td", minibatch=4, epochs=2, tau=0.5)
    other.load(tmp_path)
    for k, v in other.target.state_dict().items():
        assert torch.equal(v, after[k])
    assert [x[1:] for x in other.replay] == [x[1:] for x in learner.replay] and len(other.replay) == 7


def test_shared_head_trains_inside_the_actor_step_and_alone_in_warmup(tiny_actor, make_episodes):
    learner = SharedLearner(tiny_actor, CriticConfig(kind="shared"))
    eps = make_episodes(tiny_actor)
    batch = make_token_batch([(i, s) for i, ep in enumerate(eps) for s in ep.segments], pad_id=tiny_actor.pad_id)
    returns = torch.ones(3, 3)
    assert set(learner.joint_parameters()) == set(learner.head.parameters())
    assert learner.joint_optimizer() is learner.opt and learner.optimizers() == {"critic": learner.opt}
    head = _state(learner.head)
    assert learner.update(eps, returns, torch.zeros(3, 3), gamma=0.9, with_actor=True) == {}
    assert all(torch.equal(v, head[k]) for k, v in learner.head.state_dict().items())  # left to the actor step
    stats = learner.update(eps, returns, torch.zeros(3, 3), gamma=0.9, with_actor=False)
    assert stats["losses/value_loss"] > 0
    assert any(not torch.equal(v, head[k]) for k, v in learner.head.state_dict().items())
    hidden = tiny_actor.hidden_states(batch.input_ids, batch.attention_mask)
    loss, _ = learner.actor_loss(eps, batch, hidden, returns, torch.zeros(3, 3))
    loss.backward()
    assert any(p.grad is not None for p in tiny_actor.trainable_parameters())  # through the shared trunk


def test_no_critic_adds_nothing(tiny_actor, make_episodes):
    learner = NoCritic()
    eps = make_episodes(tiny_actor)
    values, next_values = learner.values(eps)
    assert not values.any() and not next_values.any()
    assert learner.actor_loss(eps, None, None, values, values) == (None, {})
    assert learner.joint_parameters() == [] and learner.joint_optimizer() is None and learner.optimizers() == {}


def _with_durations(eps, durations):
    """``eps`` with ``info["duration"]`` set on each turn (``None``: left out, one step)."""
    for ep, row in zip(eps, durations):
        for turn, d in zip(ep.turns, row, strict=True):
            if d is not None:
                turn.info["duration"] = d
    return eps


def test_turn_tensors_read_each_turns_duration(tiny_actor, make_episodes):
    eps = _with_durations(make_episodes(tiny_actor), [[2, None], [1, 3, 2], [None, None]])
    assert turn_tensors(eps)["durations"].tolist() == [[2, 1, 1], [1, 3, 2], [1, 1, 1]]  # padding: 1
    # A cost critic reads copies of the episodes with cost rewards: the durations stay.
    assert turn_tensors(cost_episodes(eps, "c"))["durations"].tolist() == [[2, 1, 1], [1, 3, 2], [1, 1, 1]]
    eps[2].turns[1].info["duration"] = -1
    with pytest.raises(ValueError, match=r"info\['duration'\] of episode 2 turn 1 to be an int >= 0.*got -1"):
        turn_tensors(eps)


def test_critic_advantages_discount_each_turn_by_gamma_to_its_duration(tiny_actor, tiny_tokenizer, make_episodes):
    learner = _separate(tiny_tokenizer, target="gae")
    eps = make_episodes(tiny_actor)
    values, next_values = learner.values(eps)
    tt = turn_tensors(eps)
    args = (tt["rewards"], values, next_values, tt["terminated"], tt["mask"])
    # One-step turns: the float gamma's own numbers, to the bit.
    plain = learner.advantages(eps, tt, values, next_values, gamma=0.9, lam=0.95, reward_scale=1.0)
    for got, want in zip(plain, turn_gae(*args, gamma=0.9, lam=0.95)):
        assert torch.equal(got, want)

    eps = _with_durations(eps, [[2, 1], [1, 3, 2], [None, 4]])
    tt = turn_tensors(eps)
    adv, ret = learner.advantages(eps, tt, values, next_values, gamma=0.9, lam=0.95, reward_scale=1.0)
    # 0.9 ** duration by hand (padding 0.9: never read).
    per_turn = torch.tensor([[0.81, 0.9, 0.9], [0.9, 0.729, 0.81], [0.9, 0.6561, 0.9]])
    want_adv, want_ret = turn_gae(*args, gamma=per_turn, lam=0.95)
    assert_close(adv, want_adv)
    assert_close(ret, want_ret)
    assert not torch.allclose(adv, plain[0])


def test_td_targets_keep_each_turns_duration_in_the_replay(tmp_path, tiny_actor, tiny_tokenizer, make_episodes):
    learner = _separate(tiny_tokenizer, target="td", minibatch=4, epochs=1)
    eps = _with_durations(make_episodes(tiny_actor), [[2, None], [1, 3, 2], [None, None]])
    learner.update(eps, torch.zeros(3, 3), torch.zeros(3, 3), gamma=0.9)
    assert [x[4] for x in learner.replay] == [2, 1, 1, 3, 2, 1, 1]
    learner.save(tmp_path)
    # A buffer saved before durations (4-tuples) loads as one-step transitions.
    with (tmp_path / "replay.pt").open("wb") as f:
        pickle.dump([x[:4] for x in learner.replay], f)
    other = _separate(tiny_tokenizer, target="td", minibatch=4, epochs=1)
    other.load(tmp_path)
    assert [x[4] for x in other.replay] == [1] * 7
