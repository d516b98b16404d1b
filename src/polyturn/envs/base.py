"""``ToolEnv``: a text gymnasium env in which the agent calls tools with ReAct actions.

A subclass provides a task and its tools; this base class owns the loop that
every tool-using env shares:

* parse the action (:func:`polyturn.envs.actions.parse_action`), dispatch it
  through ``self.tools`` (a plain dict name -> method taking the args dict and
  returning a :class:`ToolResult`), and turn failures into observations;
* the turn counter and ``max_turns`` truncation (``truncated``, never
  ``terminated``: only a tool that ends the task terminates);
* repeat detection: the same call (tool + args, thought ignored) or the same
  unparseable text as earlier in the episode is a repeat: penalised and
  credited with no positive term;
* reward terms (:mod:`polyturn.envs.rewards`) and the info dict of the env
  contract (docs/ARCHITECTURE.md);
* the ``remember`` tool: a valid no-op whose note stays in the transcript,
  which is the agent's memory (the trainer keeps actions in context).

Subclass hooks: :meth:`_new_task` (start an episode), :meth:`_task_features`
(extra numeric features, fixed keys) and :meth:`_repeat_key` (what counts as the
same call again). An env with reward terms of its own (sub-goals, the sandbox
penalty) names its :class:`RewardWeights` subclass in :attr:`ToolEnv.weights_class`;
tools call :meth:`achieve` to report a sub-goal result, and the base class pays
it once per episode. An env whose reward is a quantity rather
than a weighted event (a negotiated deal's utility) names it in
:attr:`ToolEnv.value_terms`; its tools report the amount in ``ToolResult.terms``
and every step reports every value term (0 when not paid).

Costs are reported beside the reward, never in it: an env that has constraint
signals (a policy violation, an error answered) names them in
:attr:`ToolEnv.cost_names` (``cost/<name>``) and reports each of them on every
step in ``info["cost_terms"]`` (0 when not incurred) from :meth:`_cost_terms`;
an env without any reports an empty dict. Constrained RL keeps their means
under limits (docs/envs/customer-service.md, "Constrained RL").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import gymnasium

from polyturn.envs.actions import FormatError, ToolCall, format_action, parse_action
from polyturn.envs.rewards import RewardWeights, StepEvents, check_terms, reward_terms
from polyturn.envs.spaces import TextSpace

RESET_OPTIONS = frozenset({"task_id", "level", "max_turns", "tools"})
BASE_FEATURES = ("turn_frac", "turns_left", "n_errors", "n_invalid", "n_repeats", "tools_used")


class BadArgs(ValueError):
    """Raised by a tool whose args are invalid; the message becomes the observation."""


@dataclass(frozen=True)
class ToolResult:
    """What a tool returns.

    ``error`` is a tool-level error kind (e.g. ``sql_error``): the call was
    valid but did not work, so it earns no ``process/valid_call``.
    ``sandbox_violation`` adds the sandbox penalty (``penalty/sandbox``, which
    the env's weights must declare). ``done`` ends the episode
    (terminated) with ``success``. ``credit=False`` marks a valid but pointless
    call (e.g. a question to the user when none was needed, a question whose
    answer the agent could already know): no process reward, and the step's
    ``info["wasted"]`` is true.
    ``terms`` pays the env's :attr:`ToolEnv.value_terms` (name -> amount).
    """

    observation: str
    _: KW_ONLY
    error: str | None = None
    sandbox_violation: bool = False
    done: bool = False
    success: bool = False
    credit: bool = True
    terms: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class EpisodeStart:
    """What a subclass's :meth:`ToolEnv._new_task` returns."""

    task_id: str
    question: str
    level: int
    ambiguous: bool
    privileged: str
    key_actions: tuple[str, ...]


def check_levels(level: int | Sequence[int], allowed: Sequence[int]) -> tuple[int, ...]:
    """``level`` (one level or several) as a tuple, each among ``allowed``; else a ValueError saying which exist."""
    levels = (level,) if isinstance(level, int) else tuple(level)
    if not levels or any(lv not in allowed for lv in levels):
        raise ValueError(f"Expected levels among {tuple(allowed)}, got {level!r}")
    return levels


def check_count(name: str, value: Any) -> int:
    """``value`` if it is an integer >= 0 (a bool is not), else a ValueError naming the option ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"Expected {name} to be an integer >= 0, got {value!r}")
    return value


def require_str(args: Mapping[str, Any], key: str, *, max_len: int = 4000) -> str:
    """``args[key]`` as a non-empty string, else :class:`BadArgs` saying what was expected."""
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise BadArgs(f'Expected {{"{key}": "<text>"}}, got {json.dumps(args, ensure_ascii=False)[:120]}')
    if len(value) > max_len:
        raise BadArgs(f"Expected {key} of at most {max_len} characters, got {len(value)}")
    return value


def dispatch_action(
    action: str,
    ev: StepEvents,
    *,
    tools: Mapping[str, Callable[[dict[str, Any]], ToolResult]],
    enabled: Sequence[str],
    repeat_key: Callable[[ToolCall], str],
) -> tuple[str, str | None, str, ToolResult | None, str]:
    """Parse and run one action: (observation, error kind, action type, tool result, repeat key).

    Records what happened in ``ev``. Shared by :class:`ToolEnv` and the multi-role envs, so a
    malformed action, an unknown tool or bad args is answered the same way everywhere.
    """
    parsed = parse_action(action)
    if isinstance(parsed, FormatError):
        obs = f"Format error ({parsed.kind}): {parsed.message}."
        return obs, "format", "invalid", None, "text:" + action.strip()
    ev.parsed = True
    key = repeat_key(parsed)
    if parsed.tool not in enabled:
        ev.invalid_call = True
        obs = f"Unknown tool {parsed.tool!r}. Available tools: {', '.join(enabled)}."
        return obs, "unknown_tool", "invalid", None, key
    try:
        result = tools[parsed.tool](parsed.args)
    except BadArgs as exc:
        ev.invalid_call = True
        return f"Bad arguments for {parsed.tool}: {exc}", "bad_args", "invalid", None, key
    ev.valid_call = result.error is None and result.credit
    ev.sandbox_violation = result.sandbox_violation
    return result.observation, result.error, parsed.tool, result, key


class ToolEnv(gymnasium.Env[str, str]):
    """Base class for text envs with tools (see the module docstring).

    Args:
        max_turns: default turn limit (a reset option may override it).
        reward_weights: a :class:`RewardWeights` (an instance of :attr:`weights_class` is kept as it is,
            another one is read field by field), or a mapping of field or term names of :attr:`weights_class`.
        render_mode: ``None`` or ``"ansi"`` (``render()`` returns the last turn as text).
        max_chars: longest observation (longer ones are cut) and action.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    #: The env's weighted reward terms: the generic ones, or a subclass that adds the env's own.
    weights_class: type[RewardWeights] = RewardWeights
    #: Reward terms whose amount a tool reports (``ToolResult.terms``) instead of weight x event.
    value_terms: tuple[str, ...] = ()
    #: The cost terms every step reports in ``info["cost_terms"]`` (:meth:`_cost_terms`); none by default.
    cost_names: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        max_turns: int = 8,
        reward_weights: RewardWeights | Mapping[str, float] | None = None,
        render_mode: str | None = None,
        max_chars: int = 4000,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"Expected max_turns >= 1, got {max_turns}")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"Expected render_mode in {self.metadata['render_modes']} or None, got {render_mode!r}")
        if isinstance(reward_weights, self.weights_class):
            self.weights = reward_weights
        else:
            data = reward_weights.model_dump() if isinstance(reward_weights, RewardWeights) else reward_weights or {}
            self.weights = self.weights_class.model_validate(data)
        check_terms(self.weights)
        self._weighted = frozenset(self.weights.terms())
        clash = set(self.value_terms) & self._weighted
        if clash:
            raise ValueError(f"Expected value_terms apart from the weighted terms, got both for {sorted(clash)}")
        self.default_max_turns = max_turns
        self.render_mode = render_mode
        self.max_chars = max_chars
        self.observation_space = TextSpace(max_chars, min_length=1)
        self.action_space = TextSpace(max_chars)
        self.tools: dict[str, Callable[[dict[str, Any]], ToolResult]] = {"remember": self._tool_remember}
        self.tool_help: dict[str, str] = {
            "remember": 'remember[{"note": "..."}]: keep a short note for later turns. Returns "Noted."'
        }
        self.enabled: tuple[str, ...] = ()
        self.max_turns = max_turns
        self.turn = 0
        self._start: EpisodeStart | None = None
        self._done = True
        self._seen: set[str] = set()
        self._achieved: set[str] = set()
        self._pending: set[str] = set()
        self._counts = dict.fromkeys(("n_errors", "n_invalid", "n_repeats"), 0)
        self._tools_used: set[str] = set()
        self._last_text = ""

    # ----- hooks for subclasses -------------------------------------------------------------
    def _new_task(self, seed: int, options: Mapping[str, Any]) -> EpisodeStart:
        """Start a task for ``seed`` (and options ``task_id``/``level``); reset per-episode state."""
        raise NotImplementedError

    def _task_features(self) -> dict[str, float]:
        """Env-specific numeric features; the key set must not change between steps."""
        return {}

    def _cost_terms(self, ev: StepEvents, error: str | None) -> dict[str, float]:
        """This step's cost terms, every name of :attr:`cost_names` (0 when not incurred); ``error`` is the step's
        error kind (a repeat included). Called once per step, after the tool ran. None by default."""
        return {}

    # ----- API ------------------------------------------------------------------------------
    def achieve(self, subgoal: str) -> None:
        """Report that the current tool call reached ``subgoal`` (paid once per episode)."""
        if f"subgoal/{subgoal}" not in self._weighted:
            raise ValueError(f"Expected sub-goal {subgoal!r} among {type(self).__name__}'s reward terms, got none: "
                             f"declare subgoal_{subgoal} in its weights_class (a RewardWeights subclass)")
        self._pending.add(subgoal)

    def tool_docs(self) -> str:
        """The action format and the enabled tools, for a system prompt."""
        names = self.enabled or tuple(self.tools)
        lines = [
            "Reply with an optional line `Thought: <short reasoning>` and then exactly one line",
            "`Action: tool_name[{json args}]`. Tools:",
        ]
        lines += [f"- {self.tool_help[name]}" for name in names]
        # One worked example: small pretrained models follow a shown format far more reliably than a described one.
        first = names[0]
        lines += ["Example reply:", "Thought: Start with the first step.", f"Action: {first}[{{}}]",
                  "Write one action per reply, in exactly that form, and nothing after it."]
        return "\n".join(lines)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; the seed fixes the task (see :data:`RESET_OPTIONS` for options)."""
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - RESET_OPTIONS
        if unknown:
            raise ValueError(f"Expected reset options among {sorted(RESET_OPTIONS)}, got unknown {sorted(unknown)}")
        tools = options.get("tools")
        if tools is None:
            enabled = tuple(self.tools)
        else:
            missing = [t for t in tools if t not in self.tools]
            if missing:
                raise ValueError(f"Expected tools among {sorted(self.tools)}, got unknown {missing}")
            enabled = tuple(dict.fromkeys(tools))
        max_turns = int(options.get("max_turns", self.default_max_turns))
        if max_turns < 1:
            raise ValueError(f"Expected max_turns >= 1, got {max_turns}")
        # Without a seed the task seed comes from np_random, so reset(seed=s); reset() is reproducible.
        task_seed = seed if seed is not None else int(self.np_random.integers(2**31 - 1))
        # A task that cannot start (an unknown task_id, a bad level) leaves the episode in progress as it was:
        # _new_task validates before it changes anything, and the episode's counters are cleared only after it.
        before = (self.enabled, self.max_turns)
        self.enabled, self.max_turns = enabled, max_turns
        try:
            self._start = self._new_task(task_seed, options)
        except Exception:
            self.enabled, self.max_turns = before
            raise
        self.turn = 0
        self._done = False
        self._seen = set()
        self._achieved = set()
        self._pending = set()
        self._counts = dict.fromkeys(self._counts, 0)
        self._tools_used = set()
        self._last_text = self._cap(self._start.question)
        info = {
            "task_id": self._start.task_id,
            "question": self._start.question,
            "level": self._start.level,
            "ambiguous": self._start.ambiguous,
            "privileged": self._start.privileged,
            "turn": 0,
            "features": self._features(),
            "tools": list(self.enabled),
            "key_actions": list(self._start.key_actions),
        }
        return self._last_text, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run one action; returns ``(observation, reward, terminated, truncated, info)``."""
        if self._done or self._start is None:
            raise RuntimeError("Expected reset() before step(), got step() on a finished or unstarted episode")
        if not isinstance(action, str):
            raise TypeError(f"Expected the action as str, got {type(action).__name__}")
        self.turn += 1
        ev = StepEvents()
        obs, error, action_type, result, key = self._dispatch(action, ev)
        ev.repeat = key in self._seen
        self._seen.add(key)
        if ev.repeat:
            error = "repeat"
            self._counts["n_repeats"] += 1
        else:
            ev.subgoals = frozenset(self._pending - self._achieved)
            self._achieved |= ev.subgoals
        self._pending = set()
        self._counts["n_errors"] += error is not None
        self._counts["n_invalid"] += action_type == "invalid"
        terminated = result is not None and result.done
        truncated = not terminated and self.turn >= self.max_turns
        success = terminated and result is not None and result.success
        if terminated:
            ev.outcome = "success" if success else "failure"
        elif truncated:
            ev.outcome = "timeout"
            obs += f"\n(Turn limit of {self.max_turns} reached without an answer.)"
        self._done = terminated or truncated
        terms = reward_terms(ev, self.weights) | self._value_terms(result)
        self._last_text = self._cap(obs)
        info = {
            "reward_terms": terms,
            "privileged": self._start.privileged,
            "success": success,
            "turn": self.turn,
            "action_valid": action_type != "invalid",
            "action_type": action_type,
            "error": error,
            # A valid call the env marked pointless (ToolResult.credit=False); errors and repeats are in `error`.
            "wasted": error is None and result is not None and not result.credit,
            "features": self._features(),
            "cost_terms": self._cost_terms(ev, error),
        }
        if ev.subgoals:  # the sub-goal events this step reached (each once an episode); absent when none
            info["subgoals"] = sorted(ev.subgoals)
        return self._last_text, sum(terms.values()), terminated, truncated, info

    def _value_terms(self, result: ToolResult | None) -> dict[str, float]:
        paid = {} if result is None else dict(result.terms)
        unknown = set(paid) - set(self.value_terms)
        if unknown:
            raise ValueError(f"Expected ToolResult.terms among value_terms {self.value_terms}, got {sorted(unknown)}")
        return {name: float(paid.get(name, 0.0)) for name in self.value_terms}

    def render(self) -> str | None:
        """With ``render_mode="ansi"``, the latest observation as text."""
        return self._last_text if self.render_mode == "ansi" else None

    # ----- helpers --------------------------------------------------------------------------
    def _dispatch(self, action: str, ev: StepEvents) -> tuple[str, str | None, str, ToolResult | None, str]:
        """Parse and run one action: (observation, error kind, action type, tool result, repeat key)."""
        out = dispatch_action(action, ev, tools=self.tools, enabled=self.enabled, repeat_key=self._repeat_key)
        result = out[3]
        if result is not None and result.sandbox_violation and "penalty/sandbox" not in self._weighted:
            raise ValueError(f"Expected penalty/sandbox among {type(self).__name__}'s reward terms for a tool that "
                             "reports sandbox_violation, got none: declare penalty_sandbox in its weights_class")
        if result is not None:
            self._tools_used.add(out[2])
        return out

    def _repeat_key(self, call: ToolCall) -> str:
        """The identity of a call for repeat detection: by default the tool and its args."""
        # The thought is not part of the key: rewording the thought does not make a call new.
        return "call:" + call.tool + json.dumps(call.args, sort_keys=True, ensure_ascii=False)

    def _cap(self, text: str) -> str:
        text = text or "(empty)"
        return text if len(text) <= self.max_chars else text[: self.max_chars - 15] + "\n(output cut)"

    def _features(self) -> dict[str, float]:
        base = {
            "turn_frac": self.turn / self.max_turns,
            "turns_left": float(self.max_turns - self.turn),
            **{k: float(v) for k, v in self._counts.items()},
            "tools_used": float(len(self._tools_used)),
        }
        return base | self._task_features()

    # ----- exploration ------------------------------------------------------------------------
    #: Tools epsilon exploration may pick. Ending tools (submit) are left out: a random answer
    #: teaches nothing a wrong answer of the policy's own does not.
    explore_tools: tuple[str, ...] = ("remember",)

    def example_args(self, tool: str, rng: Any) -> dict[str, Any]:
        """Valid arguments for ``tool``, drawn with ``rng`` (a ``numpy.random.Generator``)."""
        if tool == "remember":
            return {"note": "Check the schema before querying."}
        return {}

    def sample_valid_action(self, rng: Any) -> str:
        """A random well-formed call of an enabled exploration tool, for epsilon exploration."""
        names = [n for n in self.explore_tools if n in (self.enabled or tuple(self.tools))]
        if not names:
            names = list(self.enabled or self.tools)
        tool = names[int(rng.integers(len(names)))]
        return format_action(tool, self.example_args(tool, rng))

    def _tool_remember(self, args: dict[str, Any]) -> ToolResult:
        require_str(args, "note", max_len=1000)
        return ToolResult("Noted.")
