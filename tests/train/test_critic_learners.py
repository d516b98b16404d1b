"""The critic learners' one interface, and a target network only where TD targets read it."""

from __future__ import annotations

import torch

from polyturn.config import CriticConfig
from polyturn.models.critic import build_separate_critic
from polyturn.train.batch import make_token_batch
from polyturn.train.critics import NoCritic, SeparateLearner, SharedLearner


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
