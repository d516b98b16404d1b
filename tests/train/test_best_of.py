"""Best-of-n collection and evaluation: the critic's favourite is played with its own ids and log-probs."""

from __future__ import annotations

import pytest
import torch

import polyturn.rollout.collector as collector_module
from polyturn.rollout.best_of import PrivilegedCriticError, pick_best
from polyturn.rollout.collector import Collector
from polyturn.train.batch import make_token_batch, policy_output
from polyturn.train.trainer import Trainer

SMALL = ("critic.kind=action", "curriculum.warmup_iters=0", "curriculum.mixed_iters=0", "curriculum.ppo_iters=0",
         "env.eval_episodes=2", "rollout.num_envs=2", "env.kwargs={max_turns: 3}")


def test_pick_best_takes_the_first_highest():
    assert pick_best([0.1, 0.7, 0.7, -1.0]) == 1
    with pytest.raises(ValueError, match="at least one"):
        pick_best([])


def test_best_of_plays_the_argmax_with_the_chosen_candidates_ids_and_log_probs(tmp_path, make_cfg, monkeypatch):
    tr = Trainer(make_cfg(tmp_path, *SMALL, "rollout.best_of=3"))
    tr.actor.model.eval()
    sampled, scored = [], []

    def spy_sample(*args, **kw):
        out = real_sample(*args, **kw)
        sampled.extend(a for acts in out for a in acts)
        return out

    def scorer(inputs):
        s = tr.critic.score_candidates(inputs).tolist()
        scored.extend(zip(inputs, s))
        return s

    real_sample = collector_module.sample_candidates
    monkeypatch.setattr(collector_module, "sample_candidates", spy_sample)
    col = Collector(tr.actor, tr.envs[:2], env_id=tr.cfg.env.id, settings=tr.settings, best_of=3, scorer=scorer)
    eps = col.collect([{"seed": 900, "options": {}}, {"seed": 901, "options": {}}], temperature=1.0,
                      generator=tr.gen)
    n_turns = sum(len(ep.turns) for ep in eps)
    assert len(scored) == 3 * n_turns and len(sampled) == 3 * n_turns
    for ep in eps:
        for t, turn in enumerate(ep.turns):
            group = [(x, s) for x, s in scored if x.task == ep.question and x.history == ep.history(t)]
            assert len(group) == 3
            best = max(group, key=lambda g: g[1])
            assert turn.action == best[0].action  # the critic's favourite was played
            same = [a for a in sampled if a.ids == turn.action_ids]
            assert same and turn.logprobs == same[0].logprobs and not turn.forced  # as sampled, not as forced
    # The recorded behaviour log-probs are the policy's at those ids, in the context the episode holds.
    for ep in eps:
        batch = make_token_batch([(0, s) for s in ep.segments], pad_id=tr.actor.pad_id)
        with torch.no_grad():
            lp = policy_output(tr.actor, batch, temperature=1.0).logprobs
        m = batch.action_mask.bool()
        assert lp[m].tolist() == pytest.approx(batch.old_logprobs[m].tolist(), abs=1e-4)


def test_evaluation_refuses_a_privileged_critic_unless_labelled_oracle(tmp_path, make_cfg):
    from polyturn.cli import main
    from polyturn.eval.runner import evaluate

    Trainer(make_cfg(tmp_path / "priv", *SMALL, "critic.privileged=true")).run()
    Trainer(make_cfg(tmp_path / "open", *SMALL, "critic.privileged=false")).run()
    cases = tmp_path / "cases.jsonl"
    assert main(["make-test-cases", "--seeds", "9000:9002", "--out", str(cases),
                 "--env-kwargs", '{"max_turns": 3}']) == 0
    kw = dict(visualize=False, num_envs=2, embedder=None, n_boot=10, best_of=2)
    with pytest.raises(PrivilegedCriticError, match="unprivileged critic.*--oracle"):
        evaluate([str(tmp_path / "priv")], cases, out_dir=tmp_path / "r0", **kw)
    assert main(["evaluate", "--policy_checkpoint", str(tmp_path / "priv"), "--test_cases", str(cases),
                 "--best-of", "2", "--embedder", "none", "--out", str(tmp_path / "r1")]) == 2  # an error, not a crash
    oracle = evaluate([str(tmp_path / "priv")], cases, out_dir=tmp_path / "r2", oracle=True, **kw)
    assert [p.endswith("[best-of-2 oracle]") for p in oracle.policies] == [True]
    plain = evaluate([str(tmp_path / "open"), str(tmp_path / "open")], cases, out_dir=tmp_path / "r3",
                     critic=str(tmp_path / "open"), **kw)
    assert all(p.endswith("[best-of-2]") for p in plain.policies) and len(set(plain.policies)) == 2
