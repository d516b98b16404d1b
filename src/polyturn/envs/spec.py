"""``EnvSpec``: everything polyturn needs to know about an environment, declared beside it.

An environment package (built-in or a third-party pip package) declares one
:class:`EnvSpec` and registers it: built-in ones live in
``polyturn/envs/<name>/spec.py`` as ``SPEC``; a plugin points the Python
entry-point group ``polyturn.envs`` at its spec (or calls
:func:`polyturn.acting.registry.register`). Nothing else in polyturn lists
environments: making the env, its scripted expert, evaluation's key actions,
failure names, metrics and judge rubric, and the files ``serve`` may open all
come from here (docs/adding-an-environment.md).

Strings name classes (``"package.module:Class"``) so that declaring a spec
imports no environment code. This module imports only the standard library.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


def load_attr(ref: str) -> Any:
    """The object ``"package.module:attr"`` names (imported on first use)."""
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"Expected a reference of the form 'package.module:Name', got {ref!r}")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True, kw_only=True)
class EnvMetric:
    """A per-episode number an environment adds to evaluation reports (mean over episodes, bootstrap CI).

    ``value(record)`` takes an episode record (docs/ARCHITECTURE.md) and returns
    a float, or None when the episode has no such value (left out of the mean).
    """

    name: str
    title: str
    description: str
    value: Callable[[Mapping[str, Any]], float | None]
    unit: Literal["rate", "number"] = "number"
    higher_is_better: bool = True


@dataclass(frozen=True, kw_only=True)
class Subgoal:
    """One entry of an environment's subgoal menu, for hierarchical agents (docs/hierarchy.md).

    A manager policy sets subgoals and a worker (the actor) carries each out. ``check`` says how the env shows the
    subgoal reached, which pays the worker's intrinsic reward and cuts demonstrations into subgoals:

    * ``"subgoal:<name>"``: the step reported the env's sub-goal event ``<name>`` (``ToolEnv.achieve``, the
      ``subgoal/<name>`` reward term; ``info["subgoals"]``);
    * ``"tool:<name>"``: the step was a call of tool ``<name>`` the env accepted without an error;
    * ``"success"``: the step ended the episode in success;
    * None: the env cannot check it (no intrinsic reward; the worker's own word ends it).

    ``when``: a reset-info key (``ambiguous``) that must be true for the subgoal to apply to a task; None: always.
    """

    name: str
    text: str
    check: str | None = None
    when: str | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"Expected a subgoal name that is an identifier (verify, find_order), got {self.name!r}")
        kind, sep, arg = (self.check or "").partition(":")
        if self.check is not None and not (self.check == "success" or (sep and arg and kind in ("subgoal", "tool"))):
            raise ValueError(f"Expected subgoal {self.name!r}'s check as 'subgoal:<name>', 'tool:<name>', 'success' "
                             f"or None, got {self.check!r}")


@dataclass(frozen=True, kw_only=True)
class EnvSpec:
    """One environment's contract with polyturn.

    Attributes:
        id: the gymnasium id, ``"namespace/Name-vN"``.
        entry_point: the env class (or a function making the env), ``"package.module:Class"``; keyword
            arguments go to it.
        expert: the scripted expert class (``"package.module:Class"``), constructed as
            ``cls(env, noise=..., seed=...)`` where ``noise`` is a float or the expert's own noise
            config; None when the environment has none (``polyturn demos`` then refuses it).
        task_description: who one agent is and what it does, as a noun phrase ("an AI data analyst answering a
            user's request by calling tools (...)"), for the LLM judges' rubrics (``polyturn rate``, ``polyturn judge``)
            (e.g. "AI data analysts answering business questions over a SQLite database").
        key_actions: key-action name (as the env's ``info["key_actions"]`` lists them) -> the action
            types (``info["action_type"]``) that perform it; a name missing here is performed by the
            action type of the same name.
        action_types: the env's tools, in the order evaluation's decision tree shows them.
        observation_kinds: action type -> the name of what the environment answers to it (``run_sql``
            -> ``rows``), a decision-tree feature; unlisted types answer ``other``.
        final_action: the tool whose call commits the outcome (``submit_answer``); a failed episode
            that called it validly ends ``wrong_<final_noun>`` in failure signatures, one that never
            did ``no_<final_noun>``; None names endings by the episode's last action.
        final_noun: the noun in those names (default: ``final_action``'s last word).
        answer_kind: optional, the kind of a final action's arguments for the signature
            (``wrong_answer(number)``); takes the parsed arguments dict.
        timeout_errors: error kinds (``info["error"]``) that are tool timeouts (evaluation's
            tool-timeout rate).
        metrics: the environment's own per-episode metrics.
        data_files: what ``polyturn serve --data-dir`` may hand the environment: request field
            (e.g. ``database``) -> the constructor keyword that takes the file's path (``db_path``).
        request_errors: exception classes (``"module:Class"``) that mean the request's input is bad
            (a file that is no database): ``serve`` answers 400 instead of 500.
        breakdowns: name -> a function giving an episode record's group (CustomerService's intent); ``polyturn
            diagnose`` reports held-out success per group, beside success by level.
        partners: for a multi-role env (:mod:`polyturn.envs.multi_agent`), the scripted players self-play may
            sample as partners: ``"package.module:NAME"`` naming a dict name -> a function making a fresh
            player (``act(role_view, rng) -> action text``); None when it has none.
        holdout_partners: the same for players kept for **evaluation only**: no training config names them
            and no env option selects them; only evaluation loads this reference.
        refusals: for an env whose written policy forbids some requests, ``"package.module:function"`` naming
            ``f(forbidden, expert_options) -> (refusal, proceed) | None``: at a state whose step ``info`` holds
            ``info["forbidden"]`` (the env's own description of a request it forbids, given where the agent should
            refuse now), the expert's refusal and the step that carries the request on instead (a write, or the
            turn that leads to one) as action texts, the refusal written in the
            style of ``expert_options`` (``bc.expert_options``). Refusal preference pairs (``ppo.refusal_pairs``)
            need it; None when the env forbids nothing.
        contrasts: the counterpart of ``refusals`` at the states where a request is allowed: ``f(allowed,
            expert_options) -> (proceed, refusal) | None`` reading ``info["allowed"]``, the expert's next step there
            and a refusal written as the expert writes one. Contrast pairs (``ppo.refusal_pairs.contrast``, the
            expert's step chosen over the refusal) need it; None when the env offers none.
        subgoals: the env's subgoal menu for hierarchical agents (:class:`Subgoal`), in the order an expert
            reaches them; empty when it offers none (a hierarchical run then refuses the env; flat runs never read
            it).
    """

    id: str
    entry_point: str
    expert: str | None = None
    task_description: str = "an AI assistant completing a task with tools"
    key_actions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    action_types: tuple[str, ...] = ()
    observation_kinds: Mapping[str, str] = field(default_factory=dict)
    final_action: str | None = None
    final_noun: str | None = None
    answer_kind: Callable[[Mapping[str, Any]], str] | None = None
    timeout_errors: tuple[str, ...] = ()
    metrics: tuple[EnvMetric, ...] = ()
    data_files: Mapping[str, str] = field(default_factory=dict)
    request_errors: tuple[str, ...] = ()
    breakdowns: Mapping[str, Callable[[Mapping[str, Any]], str]] = field(default_factory=dict)
    partners: str | None = None
    holdout_partners: str | None = None
    refusals: str | None = None
    contrasts: str | None = None
    subgoals: tuple[Subgoal, ...] = ()

    def __post_init__(self) -> None:
        if "/" not in self.id or not self.id.split("/")[-1]:
            raise ValueError(f"Expected an env id 'namespace/Name-vN', got {self.id!r}")
        if ":" not in self.entry_point:
            raise ValueError(f"Expected entry_point 'package.module:Class' for {self.id}, got {self.entry_point!r}")
        for name in ("partners", "holdout_partners", "refusals", "contrasts"):
            ref = getattr(self, name)
            if ref is not None and ":" not in ref:
                raise ValueError(f"Expected {name} 'package.module:NAME' for {self.id}, got {ref!r}")
        names = [g.name for g in self.subgoals]
        if len(set(names)) != len(names):
            raise ValueError(f"Expected distinct subgoal names for {self.id}, got {names}")

    def action_types_for(self, key_action: str) -> frozenset[str]:
        """The action types that perform ``key_action``."""
        return frozenset(self.key_actions.get(key_action, (key_action,)))

    def ending_noun(self) -> str:
        """The noun of failure endings (``answer`` for ``submit_answer``)."""
        if self.final_noun:
            return self.final_noun
        return (self.final_action or "action").split("_")[-1]

    def exception_types(self) -> tuple[type[BaseException], ...]:
        """The classes of :attr:`request_errors`, imported."""
        return tuple(load_attr(ref) for ref in self.request_errors)


def final_feature(name: str) -> Callable[[Mapping[str, Any]], float | None]:
    """An :class:`EnvMetric` value: feature ``name`` after the episode's last turn (None when absent)."""

    def value(record: Mapping[str, Any]) -> float | None:
        turns = record.get("turns") or []
        features = ((turns[-1].get("info") or {}).get("features") or {}) if turns else {}
        return float(features[name]) if name in features else None

    return value
