"""The one scripted-expert base: every expert uses it, and moving onto it changed no demonstration."""

from __future__ import annotations

import hashlib
import json

import gymnasium
import pytest

import polyturn.envs  # noqa: F401  (registers the env ids)
from polyturn.acting.episodes import generate_demos
from polyturn.acting.registry import expert_class
from polyturn.envs.noise import MistakeRates
from polyturn.envs.scripted import ScriptedExpert

# sha256 of the first 25 lines of `polyturn demos --env polyturn/<Env>-v0 --episodes 500 --noise 0.3 --seed 0`
# (300 episodes for SQLAnalyst), generated at commit 8707c16, before the experts moved onto the shared base.
# A deliberate change to an environment's text or an expert's behaviour changes these: regenerate them then.
BEFORE = {
    "polyturn/CustomerService-v0": "518ed84e2009b91e5aedb1846265d1bf53a2120cb98424f170f8a37f101606af",
    "polyturn/TwentyQuestions-v0": "a9012b1927c9e5f6f0b88becaa438d12716e0fe3e7e394a1d45f08c2fafd5a93",
    "polyturn/Negotiation-v0": "9724acdd6c839c4e0635335d4013b55f31a60f819efe188956a375abd70c93a8",
    "polyturn/SQLAnalyst-v0": "2e83578f39cacfb6bea35e3f551a6755f99dcd83b6fb6ebd28b8ddfd8921fdf8",
}


@pytest.mark.parametrize("env_id", sorted(BEFORE))
def test_noisy_demonstrations_are_byte_identical_to_before_the_shared_base(env_id):
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n"
                    for r in generate_demos(env_id, episodes=25, noise=0.3, seed=0))
    assert hashlib.sha256(lines.encode("utf-8")).hexdigest() == BEFORE[env_id]


@pytest.mark.parametrize("env_id", sorted(BEFORE))
def test_every_expert_is_a_scripted_expert_with_mistake_rates(env_id):
    cls = expert_class(env_id)
    assert issubclass(cls, ScriptedExpert) and issubclass(cls.NOISE, MistakeRates)
    env = gymnasium.make(env_id, disable_env_checker=True)
    try:
        expert = cls(env, noise=0.2, seed=1)
        assert expert.name == "noisy(0.2)" and isinstance(expert.noise, cls.NOISE)
        with pytest.raises(RuntimeError, match="Expected reset"):
            expert.act("", {})
        obs, info = env.reset(seed=5)
        expert.reset(obs, info)
        assert isinstance(expert.act(obs, info), str)
    finally:
        env.close()


def test_a_planted_format_error_is_sent_then_resent_intact():
    class Two(ScriptedExpert):
        """Two fixed actions; the first goes out broken."""

        NOISE = MistakeRates
        RNG_NAME = "test"
        END_TOOL = "b"

        def _plan(self, obs, info):
            self._script = iter_script()
            self._broken_step = 0

    def iter_script():
        yield "Action: a[{}]"
        yield "Action: b[{}]"

    env = gymnasium.make("polyturn/TwentyQuestions-v0", disable_env_checker=True)
    try:
        expert = Two(env)
        expert.reset("", {})
        assert [expert.act("", {}) for _ in range(3)] == ["Action: a {}]", "Action: a[{}]", "Action: b[{}]"]
        with pytest.raises(RuntimeError, match="Expected the episode to end at b"):
            expert.act("", {})
    finally:
        env.close()
