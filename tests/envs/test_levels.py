"""Every environment takes one level or a list of levels, in its constructor and in the ``level`` reset option."""

from __future__ import annotations

import gymnasium
import pytest

import polyturn.envs  # noqa: F401  (registers the env ids)

ENV_IDS = ["polyturn/SQLAnalyst-v0", "polyturn/CustomerService-v0", "polyturn/TwentyQuestions-v0",
           "polyturn/Negotiation-v0"]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_a_level_list_draws_only_those_levels_and_each_of_them(env_id):
    env = gymnasium.make(env_id, disable_env_checker=True, level=[1, 2])
    try:
        drawn = [env.reset(seed=s)[1]["level"] for s in range(24)]
        assert set(drawn) == {1, 2}, drawn
        assert [env.reset(seed=s)[1]["level"] for s in range(24)] == drawn  # the seed decides
        assert {env.reset(seed=s, options={"level": [2, 3]})[1]["level"] for s in range(24)} == {2, 3}
        assert {env.reset(seed=s, options={"level": 3})[1]["level"] for s in range(6)} == {3}
        with pytest.raises(ValueError, match="Expected levels among"):
            env.reset(seed=0, options={"level": [1, 9]})
    finally:
        env.close()
    with pytest.raises(ValueError, match="Expected levels among"):
        gymnasium.make(env_id, disable_env_checker=True, level=[])
