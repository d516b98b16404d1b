"""Layered reward terms: outcome, sub-goals, process, penalties.

Each step's reward is the sum of named terms ``group/name``; every step
reports all of the env's terms (zeros included) so logs stay aligned across
steps and episodes. Weights come from :class:`RewardWeights` (signed:
penalties are negative numbers), which holds only the terms every tool-using
env shares. The defaults, after the layered design of the source text:

=========================  =======  ==============================================
term                       default  paid when
=========================  =======  ==============================================
outcome/success            +10      the submitted answer is right (episode ends)
outcome/failure             -5      the submitted answer is wrong (episode ends)
outcome/timeout             -5      ``max_turns`` reached without an answer
                                    (truncated); as bad as a wrong answer, so
                                    stalling never beats trying
process/well_formed        +0.02    the action parses
process/valid_call         +0.05    an enabled tool, valid args, and no tool error
penalty/unparseable        -0.2     the action does not parse
penalty/invalid_call       -0.1     unknown or disabled tool, or bad args
penalty/repeat             -0.5     the same call (tool + args) as earlier in the
                                    episode, or the same unparseable text
penalty/turn_cost          -0.01    every turn
=========================  =======  ==============================================

An env adds its own terms by subclassing :class:`RewardWeights` (its
``ToolEnv.weights_class``): ``subgoal_<name>`` fields, paid when a tool calls
``ToolEnv.achieve("<name>")``, and ``penalty_sandbox``, paid when a tool returns
``ToolResult(sandbox_violation=True)`` (the SQL env's
:class:`~polyturn.envs.sql.env.SQLAnalystWeights` declares both). Sub-goals pay
for results, not calls, and at most once per episode; a repeated action earns no
positive term at all (only its penalties).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Outcome = Literal["success", "failure", "timeout"]


class RewardWeights(BaseModel):
    """Weights of the generic reward terms; field ``group_name`` is the term ``group/name``.

    Accepts either spelling as input: ``RewardWeights(outcome_success=5)`` or
    ``RewardWeights.model_validate({"outcome/success": 5})``. Positive terms
    must be >= 0 and penalties <= 0, so a typo cannot turn a penalty into a bonus.
    An env's own terms live in a subclass (see the module docstring).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Groups in the order :meth:`terms` lists them (fields of a group in declaration order). The step's
    #: reward sums the terms in this order, and a float sum depends on its order: a subclass may change
    #: it only where it must keep an earlier order (CustomerService, whose sub-goals came last).
    group_order: ClassVar[tuple[str, ...]] = ("outcome", "subgoal", "process", "penalty")

    outcome_success: float = Field(10.0, ge=0, description="Right answer submitted.")
    outcome_failure: float = Field(-5.0, le=0, description="Wrong answer submitted.")
    outcome_timeout: float = Field(-5.0, le=0, description="max_turns reached without an answer.")
    process_well_formed: float = Field(0.02, ge=0, description="The action parses.")
    process_valid_call: float = Field(0.05, ge=0, description="Enabled tool, valid args, no tool error.")
    penalty_unparseable: float = Field(-0.2, le=0, description="The action does not parse.")
    penalty_invalid_call: float = Field(-0.1, le=0, description="Unknown or disabled tool, or bad args.")
    penalty_repeat: float = Field(-0.5, le=0, description="Same call as earlier in the episode.")
    penalty_turn_cost: float = Field(-0.01, le=0, description="Every turn.")

    @model_validator(mode="before")
    @classmethod
    def _accept_term_names(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {str(k).replace("/", "_", 1): v for k, v in data.items()}
        return data

    def terms(self) -> dict[str, float]:
        """Term name -> weight, group by group in :attr:`group_order`, each group in declaration order."""
        rank = {group: i for i, group in enumerate(self.group_order)}
        fields = sorted(self.model_dump().items(), key=lambda kv: rank.get(kv[0].partition("_")[0], len(rank)))
        return {name.replace("_", "/", 1): value for name, value in fields}


@dataclass(kw_only=True)
class StepEvents:
    """What happened in one step, as far as rewards are concerned."""

    parsed: bool = False
    valid_call: bool = False
    invalid_call: bool = False
    repeat: bool = False
    sandbox_violation: bool = False
    subgoals: frozenset[str] = field(default_factory=frozenset)  # newly achieved this step
    outcome: Outcome | None = None


def well_formed(ev: StepEvents) -> bool:
    """The action parsed (and is not a repeat)."""
    return ev.parsed and not ev.repeat


def valid_call(ev: StepEvents) -> bool:
    """The call ran without error (and is not a repeat)."""
    return ev.valid_call and not ev.repeat


def unparseable(ev: StepEvents) -> bool:
    """The action did not parse."""
    return not ev.parsed


def invalid_call(ev: StepEvents) -> bool:
    """Unknown or disabled tool, or bad args."""
    return ev.invalid_call


def repeat(ev: StepEvents) -> bool:
    """Same call as earlier in the episode."""
    return ev.repeat


def turn_cost(ev: StepEvents) -> bool:
    """Every turn pays it."""
    return True


def sandbox(ev: StepEvents) -> bool:
    """A tool refused the call (a query refused or timed out, a policy broken)."""
    return ev.sandbox_violation


EVENT_TERMS: dict[str, Callable[[StepEvents], bool]] = {
    "process/well_formed": well_formed,
    "process/valid_call": valid_call,
    "penalty/unparseable": unparseable,
    "penalty/invalid_call": invalid_call,
    "penalty/repeat": repeat,
    "penalty/turn_cost": turn_cost,
    "penalty/sandbox": sandbox,
}


def term_fires(term: str, ev: StepEvents) -> bool:
    """Whether ``term`` is paid for the step ``ev``; ``outcome/*`` and ``subgoal/*`` work for any name."""
    group, _, name = term.partition("/")
    if group == "outcome":
        return ev.outcome == name
    if group == "subgoal":
        return name in ev.subgoals and not ev.repeat
    return EVENT_TERMS[term](ev)


def check_terms(weights: RewardWeights) -> None:
    """Raise if a weight has no rule that pays it (e.g. a subclass added an unknown penalty)."""
    for term in weights.terms():
        group = term.partition("/")[0]
        if group not in weights.group_order:
            raise ValueError(f"Expected reward term groups among {weights.group_order}, got {term!r}")
        if group not in ("outcome", "subgoal") and term not in EVENT_TERMS:
            raise ValueError(f"Expected reward terms with a rule in EVENT_TERMS, got {term!r}")


def reward_terms(ev: StepEvents, weights: RewardWeights) -> dict[str, float]:
    """All terms for one step (zeros included); their sum is the step's reward.

    >>> terms = reward_terms(StepEvents(parsed=True, valid_call=True), RewardWeights())
    >>> terms["process/well_formed"], terms["process/valid_call"], terms["penalty/turn_cost"]
    (0.02, 0.05, -0.01)
    >>> reward_terms(StepEvents(parsed=True, valid_call=True, repeat=True), RewardWeights())["penalty/repeat"]
    -0.5
    """
    return {term: (w if term_fires(term, ev) else 0.0) for term, w in weights.terms().items()}
