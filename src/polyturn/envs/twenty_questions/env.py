"""``polyturn/TwentyQuestions-v0``: find the hidden object with yes/no questions (after LMRL-Gym).

The env thinks of an object from the shipped knowledge base
(:mod:`.knowledge`: 235 objects, 78 yes/no attributes). The agent asks
questions and guesses:

* ``ask[{"question": "Is it an animal?"}]``: the oracle maps the question to
  an attribute through the documented phrasings (``knowledge.txt``; matching
  ignores case, punctuation and extra spaces) and answers ``Yes.`` or ``No.``;
  a question it does not know gets ``I don't know.`` and the
  ``penalty/unknown_question`` term. "Is it a <object>?" naming a known object
  counts as a guess.
* ``guess[{"object": "dog"}]``: ``Yes! You found it: dog.`` ends the episode
  (terminated, success); a wrong guess is answered ``No, it is not ...`` and the
  game goes on.

``list_candidates=N`` (0: off, the default, LMRL-Gym's game) makes the oracle
track the candidate set for the agent: once at most N objects fit every answer
so far, each answer ends with them, ``Yes. Objects that fit every answer so far
(3): whale, dolphin, starfish.`` An easier, documented variant: the agent no
longer needs the 235 x 78 table by heart to know what is left, only to ask
questions that split and to guess from the list (a 135M actor cloned from 96
games did not learn the table; docs/envs/twenty-questions.md).

Rewards follow LMRL-Gym: -1 every turn (``penalty/turn_cost``) except the turn of
the correct guess, which pays 0 (``outcome/success`` +1 cancels that turn's
cost); 20 turns at most (truncated). So a return lies in [-20, 0] before the
small unknown-question penalty; :mod:`.score` puts returns on LMRL-Gym's
normalised scale. Every other shaping term of :class:`RewardWeights` is 0 by
default (``reward_weights`` may set them).

Levels 1-3 group objects by how many questions the greedy information-gain
questioner needs (<= 7, 8, >= 9). ``task_id`` is ``20q-<object>`` (spaces as
``_``). Privileged text: the hidden object and its attributes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from functools import cache
from typing import Any

from polyturn.envs.actions import ToolCall, format_action
from polyturn.envs.base import BadArgs, EpisodeStart, ToolEnv, ToolResult, check_count, check_levels, require_str
from polyturn.envs.rewards import RewardWeights
from polyturn.envs.twenty_questions.knowledge import (
    Knowledge,
    best_question,
    filter_candidates,
    load_knowledge,
    normalise,
    object_key,
)

LEVELS = (1, 2, 3)
#: LMRL-Gym's reward: only the turn cost and the refund on the correct guess; no other shaping.
DEFAULT_WEIGHTS: dict[str, float] = {
    **dict.fromkeys(RewardWeights().terms(), 0.0),
    "outcome/success": 1.0,
    "penalty/turn_cost": -1.0,
}
TOOL_HELP = {
    "ask": 'ask[{"question": "Is it an animal?"}]: a yes/no question; the answer is Yes., No. or '
    "I don't know. (for a question outside the known phrasings).",
    "guess": 'guess[{"object": "dog"}]: name the object. Right: the game ends; wrong: "No, it is not ...".',
}
TQ_FEATURES = ("n_questions", "n_yes", "n_no", "n_unknown", "n_wrong_guesses", "log2_candidates")


def greedy_question_count(kb: Knowledge, index: int) -> int:
    """Questions the greedy information-gain questioner asks before only object ``index`` is left."""
    candidates, asked = list(range(len(kb.objects))), []
    while len(candidates) > 1:
        attr = best_question(kb, candidates, asked)
        if attr is None:  # cannot happen on a checked knowledge base (every object is distinct)
            break
        asked.append(attr)
        candidates = filter_candidates(kb, candidates, attr, kb.answer(index, attr))
    return len(asked)


@cache
def object_levels(kb: Knowledge) -> tuple[int, ...]:
    """Each object's level: 1 (<= 7 greedy questions), 2 (8) or 3 (>= 9)."""
    return tuple(min(3, max(1, greedy_question_count(kb, i) - 6)) for i in range(len(kb.objects)))


def task_id_of(name: str) -> str:
    """``20q-<name>`` with spaces as underscores."""
    return "20q-" + name.replace(" ", "_")


class TwentyQuestionsEnv(ToolEnv):
    """Twenty Questions over the shipped knowledge base (see the module docstring).

    Args:
        level: default level(s) the hidden object is drawn from (1-3; all by default).
        max_turns: turns before truncation (20, as in LMRL-Gym).
        unknown_question_penalty: ``penalty/unknown_question`` paid for a question the oracle
            does not know (<= 0).
        reward_weights: overrides of :data:`DEFAULT_WEIGHTS` (a mapping of term names, or a
            full :class:`RewardWeights`).
        knowledge_path: another knowledge file in the same format (default: the shipped one).
        list_candidates: once at most this many objects fit the answers so far, every answer lists them
            (0: never, the default).
        render_mode: ``None`` or ``"ansi"``.
    """

    value_terms = ("penalty/unknown_question",)
    explore_tools = ("ask", "guess")

    def __init__(
        self,
        *,
        level: int | list[int] | tuple[int, ...] | None = None,
        max_turns: int = 20,
        unknown_question_penalty: float = -0.1,
        reward_weights: RewardWeights | Mapping[str, float] | None = None,
        knowledge_path: str | None = None,
        list_candidates: int = 0,
        render_mode: str | None = None,
    ) -> None:
        if unknown_question_penalty > 0:
            raise ValueError(f"Expected unknown_question_penalty <= 0, got {unknown_question_penalty}")
        self.list_candidates = check_count("list_candidates", list_candidates)
        # Overrides come last; RewardWeights reads `outcome/success` and `outcome_success` alike, the last winning.
        weights = reward_weights if isinstance(reward_weights, RewardWeights) else {
            **DEFAULT_WEIGHTS, **dict(reward_weights or {})}
        super().__init__(max_turns=max_turns, reward_weights=weights, render_mode=render_mode)
        self.kb = load_knowledge(knowledge_path)
        self.levels = check_levels(LEVELS if level is None else level, LEVELS)
        self.unknown_question_penalty = float(unknown_question_penalty)
        self.tools = {"ask": self._ask, "guess": self._guess}
        self.tool_help |= TOOL_HELP
        self.target = 0
        self.candidates: list[int] = []
        self._counts_tq = dict.fromkeys(TQ_FEATURES[:-1], 0)

    # ----- episode ----------------------------------------------------------------------------
    def _new_task(self, seed: int, options: Mapping[str, Any]) -> EpisodeStart:
        self.target = self._pick(seed, options)
        self.candidates = list(range(len(self.kb.objects)))
        self._counts_tq = dict.fromkeys(self._counts_tq, 0)
        name = self.kb.objects[self.target]
        intro = (
            "Let's play Twenty Questions. I am thinking of an object. Ask yes/no questions with ask, "
            f"then name it with guess. You have {self.max_turns} turns."
        )
        return EpisodeStart(
            task_id=task_id_of(name),
            question=intro,
            level=object_levels(self.kb)[self.target],
            ambiguous=False,
            privileged=self.kb.privileged(self.target),
            key_actions=("ask", "guess"),
        )

    def _pick(self, seed: int, options: Mapping[str, Any]) -> int:
        task_id = options.get("task_id")
        if task_id is not None:
            index = self.kb.object_named(str(task_id).removeprefix("20q-").replace("_", " "))
            if index is None or not str(task_id).startswith("20q-"):
                raise ValueError(f"Expected a task_id like '20q-ice_cream' naming a known object, got {task_id!r}")
            return index
        levels = self.levels if options.get("level") is None else check_levels(options["level"], LEVELS)
        pool = [i for i, lv in enumerate(object_levels(self.kb)) if lv in levels]
        return pool[random.Random(f"polyturn-20q-{seed}").randrange(len(pool))]

    def _task_features(self) -> dict[str, float]:
        return {k: float(v) for k, v in self._counts_tq.items()} | {
            "log2_candidates": math.log2(max(1, len(self.candidates)))
        }

    def tool_docs(self) -> str:
        """The rules, the action format, the tools and one phrasing of every question the oracle knows."""
        names = self.enabled or tuple(self.tools)
        questions = " ".join(a.phrasings[0] for a in self.kb.attributes)
        return "\n".join([
            "Twenty Questions: find the hidden object with yes/no questions, then guess it.",
            "Reply with an optional line `Thought: <short reasoning>` and then exactly one line",
            "`Action: tool_name[{json args}]`. Tools:",
            *[f"- {self.tool_help[n]}" for n in names],
            f"Questions the oracle understands (case and punctuation do not matter): {questions}",
            *([f"Once at most {self.list_candidates} objects fit every answer so far, each answer lists them."]
              if self.list_candidates else []),
            "Example reply:",
            format_action("ask", {"question": self.kb.attributes[0].phrasings[0]}, "Start with a broad split."),
            "Write one action per reply, in exactly that form, and nothing after it.",
        ])

    # ----- tools ------------------------------------------------------------------------------
    def _ask(self, args: dict[str, Any]) -> ToolResult:
        question = require_str(args, "question", max_len=300)
        attr = self.kb.attribute_of(question)
        if attr is None:
            guessed = self.kb.guessed_object(question)
            if guessed is not None:
                return self._judge_guess(guessed, self.kb.objects[guessed])
            self._counts_tq["n_unknown"] += 1
            return ToolResult("I don't know.", error="unknown_question", credit=False,
                              terms={"penalty/unknown_question": self.unknown_question_penalty})
        self._counts_tq["n_questions"] += 1
        yes = self.kb.answer(self.target, attr)
        self._counts_tq["n_yes" if yes else "n_no"] += 1
        before = len(self.candidates)
        self.candidates = filter_candidates(self.kb, self.candidates, attr, yes)
        # Pointless (info["wasted"]): every object left gives the same answer, or at most two are left, where a
        # guess wins sooner on average (1.5 turns against 2 for two objects, 1 against 2 for one).
        pointless = before <= 2 or len(self.candidates) == before
        return ToolResult(("Yes." if yes else "No.") + self._listed(), credit=not pointless)

    def _guess(self, args: dict[str, Any]) -> ToolResult:
        name = require_str(args, "object", max_len=80)
        if not object_key(name):
            raise BadArgs(f'Expected {{"object": "<name>"}} with letters or digits, got {name!r}')
        return self._judge_guess(self.kb.object_named(name), object_key(name))

    def _judge_guess(self, index: int | None, said: str) -> ToolResult:
        if index == self.target:
            return ToolResult(f"Yes! You found it: {self.kb.objects[self.target]}.", done=True, success=True)
        self._counts_tq["n_wrong_guesses"] += 1
        if index is not None:
            self.candidates = [i for i in self.candidates if i != index]
        return ToolResult(f"No, it is not {said}." + self._listed())

    def _listed(self) -> str:
        """With ``list_candidates`` and at most that many objects left: `` Objects that fit ... (n): a, b.``."""
        n = len(self.candidates)
        if not 0 < n <= self.list_candidates:
            return ""
        names = ", ".join(self.kb.objects[i] for i in self.candidates)
        return f" Objects that fit every answer so far ({n}): {names}."

    def _repeat_key(self, call: ToolCall) -> str:
        """A question is the same as an earlier one when it asks the same attribute, whatever the phrasing."""
        value = call.args.get("question" if call.tool == "ask" else "object")
        if call.tool not in self.tools or not isinstance(value, str):
            return super()._repeat_key(call)
        attr = self.kb.attribute_of(value) if call.tool == "ask" else None
        if attr is not None:
            return "attr:" + attr
        index = self.kb.guessed_object(value) if call.tool == "ask" else self.kb.object_named(value)
        return f"object:{index}" if index is not None else f"{call.tool}:{normalise(value)}"

    def example_args(self, tool: str, rng: Any) -> dict[str, Any]:
        """A documented question, or a known object's name."""
        if tool == "ask":
            attr = self.kb.attributes[int(rng.integers(len(self.kb.attributes)))]
            return {"question": attr.phrasings[int(rng.integers(len(attr.phrasings)))]}
        if tool == "guess":
            return {"object": self.kb.objects[int(rng.integers(len(self.kb.objects)))]}
        return super().example_args(tool, rng)
