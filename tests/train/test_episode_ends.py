"""How an episode's end enters credit assignment (docs/ARCHITECTURE.md, "Episode ends and bootstrapping").

* terminated (an answer was submitted): no bootstrap;
* the env's own turn limit (truncated, no turns left; the env scores it as an outcome): no bootstrap either,
  the state after it is worth exactly 0;
* any other truncation: bootstrap from V of the state after the last turn, which the shared critic reads
  at the same kind of token as every other state.
Both critic kinds follow the rule, and so do GAE and the TD targets.
"""

from __future__ import annotations

import torch

from polyturn.algos.gae import turn_gae
from polyturn.config import CriticConfig
from polyturn.models.critic import build_separate_critic
from polyturn.train.batch import make_token_batch
from polyturn.train.critics import SeparateLearner, SharedLearner, bootstraps, state_input, state_positions


def test_only_a_truncation_that_is_not_the_turn_limit_bootstraps(tiny_actor, make_episodes):
    success, limit, cut = make_episodes(tiny_actor)
    assert success.terminated and limit.truncated and cut.truncated  # the data keeps the env's flags apart
    assert (bootstraps(success), bootstraps(limit), bootstraps(cut)) == (False, False, True)


def _separate(tiny_tokenizer, **cfg) -> SeparateLearner:
    critic = build_separate_critic(encoder="scratch", tokenizer=tiny_tokenizer, hidden=32, layers=1, heads=4,
                                   max_len=128, feature_names=["turns_left"], include_privileged=True)
    return SeparateLearner(critic, CriticConfig(**cfg))


def test_separate_critic_values_follow_the_rule(tiny_actor, tiny_tokenizer, make_episodes):
    eps = make_episodes(tiny_actor)
    learner = _separate(tiny_tokenizer)
    values, next_values = learner.values(eps)
    v_final = learner.critic.values([state_input(eps[2], 2)], batch_size=1)
    assert next_values[1, 2] == 0.0  # turn limit: V(s_T) = 0, the critic is not asked
    assert torch.allclose(next_values[2, 1], v_final[0]) and v_final[0] != 0.0
    assert torch.equal(next_values[0, 0], values[0, 1]) and torch.equal(next_values[1, 1], values[1, 2])
    rewards = torch.tensor([[-0.01, 10.0, 0.0], [-0.01, -0.01, -5.0], [-0.01, -5.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]])
    terminated = torch.tensor([[0, 1, 0], [0, 0, 0], [0, 0, 0]])
    adv, _ = turn_gae(rewards, values, next_values, terminated, mask, gamma=0.9, lam=1.0)
    assert torch.allclose(adv[1, 2], -5.0 - values[1, 2])  # no bootstrap after the turn limit
    assert torch.allclose(adv[2, 1], -5.0 + 0.9 * v_final[0] - values[2, 1])


def test_td_targets_follow_the_rule(tiny_actor, tiny_tokenizer, make_episodes):
    eps = make_episodes(tiny_actor)
    learner = _separate(tiny_tokenizer, target="td", minibatch=4, epochs=1)
    learner.update(eps, torch.zeros(3, 3), torch.zeros(3, 3), gamma=0.9)
    done = [x[3] for x in learner.replay]
    assert done == [False, True, False, False, True, False, False]  # success end, turn limit end, cut end


def test_shared_critic_follows_the_rule_and_reads_every_state_at_the_same_token(tiny_actor, make_episodes):
    eps = make_episodes(tiny_actor)
    learner = SharedLearner(tiny_actor, CriticConfig(kind="shared"))
    batch = make_token_batch([(i, s) for i, ep in enumerate(eps) for s in ep.segments], pad_id=tiny_actor.pad_id)
    pos = state_positions(batch, 3)
    ids = batch.input_ids
    # The state before each turn is read at the last token of the assistant opening; the state after a
    # cut episode's last turn is read at the same token of the opening that follows its last observation.
    opening = int(ids[0, pos[0, 0]])
    assert all(int(ids[r, pos[r, t]]) == opening for r, t in [(0, 1), (1, 0), (1, 2), (2, 0), (2, 1)])
    n_real = int(batch.attention_mask[2].sum())
    assert int(pos[2, 3]) == n_real - 1 and int(ids[2, n_real - 1]) == opening
    values, next_values = learner.values(eps, batch)
    hidden = tiny_actor.hidden_states(batch.input_ids, batch.attention_mask)
    with torch.no_grad():
        v_final = learner.head(hidden[2:3], positions=torch.tensor([n_real - 1]))
    assert next_values[1, 2] == 0.0
    assert torch.allclose(next_values[2, 1], v_final[0], atol=1e-6)
