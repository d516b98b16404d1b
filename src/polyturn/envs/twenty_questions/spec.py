"""The spec of ``polyturn/TwentyQuestions-v0`` (:class:`polyturn.envs.spec.EnvSpec`)."""

from __future__ import annotations

from polyturn.envs.spec import EnvMetric, EnvSpec
from polyturn.envs.twenty_questions.score import game_return

SPEC = EnvSpec(
    id="polyturn/TwentyQuestions-v0",
    entry_point="polyturn.envs.twenty_questions.env:TwentyQuestionsEnv",
    expert="polyturn.envs.twenty_questions.expert:TwentyQuestionsExpert",
    task_description="an AI player of Twenty Questions finding a hidden object with yes/no questions by calling "
                     "tools (ask, guess)",
    action_types=("ask", "guess", "remember"),
    observation_kinds={"ask": "user_reply", "guess": "user_reply"},
    final_action="guess",
    metrics=(EnvMetric(name="game_return", title="Game return",
                       description="LMRL-Gym's return: minus the turns that were not the correct guess "
                                   "(0 = right on the first turn); the normalised score's input.",
                       value=lambda r: game_return(r) if r.get("turns") else None),),
)
