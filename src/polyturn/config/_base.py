"""Shared pieces of the config sections: the error type, the strict base model, task-group share checks."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the YAML."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


GroupShares = dict[str, Annotated[float, Field(gt=0, le=1)]]


def _balance_by(what: str) -> Any:
    return Field(None, description=f"With group_shares: the env's breakdown that groups {what} (CustomerService: "
                 "intent).")


def _group_shares(what: str, skipped: str) -> Any:
    return Field(default_factory=dict, description=f"Share of {what} each named group gets, e.g. {{forbidden: 0.3}} "
                 "with balance_by intent (the natural share is ~0.14); the groups not named share the rest in seed "
                 f"order. {skipped}")


def _check_shares(section: str, balance_by: str | None, shares: dict[str, float]) -> None:
    if shares and not balance_by:
        raise ValueError(f"{section}.group_shares needs {section}.balance_by, the breakdown that names the groups "
                         "(e.g. intent)")
    if sum(shares.values()) > 1 + 1e-9:
        raise ValueError(f"Expected {section}.group_shares summing to at most 1, got {shares}")
