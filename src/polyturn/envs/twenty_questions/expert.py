"""Scripted questioners for ``polyturn/TwentyQuestions-v0``: greedy information gain, exact or noisy.

The exact expert keeps the objects of the (public, shipped) knowledge base that
agree with every answer so far, asks the attribute whose answer splits them
most evenly (the largest information gain; :func:`.knowledge.best_question`),
and guesses as soon as at most two candidates are left (guessing one of two
costs 1.5 turns on average, a question and then a guess 2). It reads the answers
from the observation text only.

:class:`TQNoise` sets the probability of each mistake, each one a decision
RL can improve on: asking a random informative attribute instead of the best
(per question), guessing a random candidate too early (per question while more
than two are left), one undocumented phrasing that gets "I don't know", one
repeated question, and one malformed action (the last three per episode).

``name_candidates=N`` (0: off, the default, which the shipped figures used) makes
every thought name the candidates once at most N are left, so a guess copies a
name the thought has just written: "3 candidates left: apple, pear, plum; split
them." A small pretrained actor cloned from the default thoughts ("N candidates
left") learned to count down but never to guess (docs/envs/twenty-questions.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium
from pydantic import Field

from polyturn.envs.actions import format_action
from polyturn.envs.base import check_count
from polyturn.envs.noise import MistakeRates
from polyturn.envs.scripted import ScriptedExpert
from polyturn.envs.twenty_questions.knowledge import best_question, filter_candidates, split_entropy


class TQNoise(MistakeRates):
    """Probabilities of the questioner's mistakes (all 0: the exact expert)."""

    random_order: float = Field(0.0, ge=0, le=1, description="Per question: a random informative attribute.")
    premature_guess: float = Field(0.0, ge=0, le=1, description="Per question: guess a random candidate instead.")
    unknown_phrasing: float = Field(0.0, ge=0, le=1, description="Per episode: one question the oracle cannot map.")
    repeat_question: float = Field(0.0, ge=0, le=1, description="Per episode: ask an earlier question again.")
    format_error: float = Field(0.0, ge=0, le=1, description="Per episode: one malformed action, rewritten next.")


class TwentyQuestionsExpert(ScriptedExpert):
    """Greedy information-gain questioner (a :class:`ScriptedExpert`: ``cls(env, noise=..., seed=...)``); it
    reads the env's knowledge base, never the hidden object. ``noise``: a :class:`TQNoise`, or one
    probability for every mistake."""

    NOISE = TQNoise
    RNG_NAME = "polyturn-20q-expert"
    END_TOOL = "a correct guess"

    def __init__(self, env: gymnasium.Env, *, noise: float | TQNoise = 0.0, seed: int = 0,
                 name_candidates: int = 0) -> None:
        super().__init__(env, noise=noise, seed=seed)
        self.name_candidates = check_count("name_candidates", name_candidates)
        self.kb = self.env.kb
        self.candidates: list[int] = []
        self.asked: list[str] = []
        self._last: tuple[str, Any] | None = None
        self._unknown_step = -1
        self._repeat_step = -1

    def _plan(self, obs: str, info: Mapping[str, Any]) -> None:
        """Every object is a candidate; draw the per-episode mistakes (format error, phrasing, repeat)."""
        self.candidates = list(range(len(self.kb.objects)))
        self.asked = []
        self._last = None
        self._broken_step = self.rng.randrange(6) if self._chance("format_error") else -1
        self._unknown_step = self.rng.randrange(6) if self._chance("unknown_phrasing") else -1
        self._repeat_step = 2 + self.rng.randrange(5) if self._chance("repeat_question") else -1

    def _next(self, obs: str, info: Mapping[str, Any]) -> str:
        self._read(obs)
        return self._decide()

    def _read(self, obs: str) -> None:
        """Update the candidates from the answer to the previous action."""
        if self._last is None:
            return
        kind, what = self._last
        self._last = None
        if kind == "ask" and obs.startswith(("Yes.", "No.")):
            self.candidates = filter_candidates(self.kb, self.candidates, what, obs.startswith("Yes."))
        elif kind == "guess" and obs.startswith("No"):
            self.candidates = [i for i in self.candidates if i != what] or self.candidates

    def _decide(self) -> str:
        if self._step == self._unknown_step:
            self._last = ("unknown", None)
            return format_action("ask", {"question": "Is it something I would like?"}, "Ask what I want to know.")
        if self._step >= self._repeat_step >= 0 and self.asked:
            self._repeat_step = -1
            attr = self.asked[self.rng.randrange(len(self.asked))]
            self._last = ("ask", attr)
            return self._ask(attr, "Check that answer again.")
        if len(self.candidates) <= 2:
            return self._guess(self.candidates[0], self._named("Few candidates are left; guess one."))
        if self._chance("premature_guess"):
            return self._guess(self.candidates[self.rng.randrange(len(self.candidates))],
                               self._named("Try a guess now."))
        attr = best_question(self.kb, self.candidates, self.asked)
        if attr is None:  # the candidates cannot be told apart: guess them in turn
            return self._guess(self.candidates[0], self._named("No question separates them; guess."))
        if self._chance("random_order"):
            useful = [a for a in self.kb.attribute_ids
                      if a not in self.asked and split_entropy(self.kb, self.candidates, a) > 0]
            attr = useful[self.rng.randrange(len(useful))]
        self.asked.append(attr)
        self._last = ("ask", attr)
        return self._ask(attr, self._named("split them.", f"{len(self.candidates)} candidates left; split them."))

    def _named(self, then: str, default: str | None = None) -> str:
        """The thought: with ``name_candidates`` and at most that many left, the candidates by name, then ``then``."""
        n = len(self.candidates)
        if not 0 < n <= self.name_candidates:
            return then if default is None else default
        names = ", ".join(self.kb.objects[i] for i in self.candidates)
        return f"{n} candidate{'s' if n > 1 else ''} left: {names}; {then[0].lower()}{then[1:]}"

    def _ask(self, attr: str, thought: str) -> str:
        return format_action("ask", {"question": self.kb.attribute(attr).phrasings[0]}, thought)

    def _guess(self, index: int, thought: str) -> str:
        self._last = ("guess", index)
        return format_action("guess", {"object": self.kb.objects[index]}, thought)
