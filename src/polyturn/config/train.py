"""``TrainConfig``, the whole config, and reading it: YAML and ``--set`` overrides in, validated objects out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from polyturn.config._base import ConfigError, _Section
from polyturn.config.curriculum import CurriculumConfig
from polyturn.config.models import ActorConfig, CriticConfig
from polyturn.config.objectives import ConstraintsConfig, OfflineConfig, JudgeConfig
from polyturn.config.rollout import RolloutConfig, SelfPlayConfig, HierarchyConfig
from polyturn.config.run import RunConfig, EnvConfig
from polyturn.config.updates import BCConfig, PPOConfig


class TrainConfig(_Section):
    """The whole run: ``polyturn train --config FILE``."""

    run: RunConfig = Field(default_factory=RunConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    bc: BCConfig = Field(default_factory=BCConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    selfplay: SelfPlayConfig = Field(default_factory=SelfPlayConfig)
    hierarchy: HierarchyConfig | None = Field(
        None, description="Hierarchical agents: a manager and a worker policy over a single-agent env that offers "
        "subgoals. null: a flat agent.")
    constraints: ConstraintsConfig | None = Field(
        None, description="Constrained RL: cost terms kept under limits by Lagrange multipliers. null: none.")
    offline: OfflineConfig | None = Field(
        None, description="Offline RL from recorded episodes before the RL phases (docs/offline.md). null: none.")
    judge: JudgeConfig | None = Field(
        None, description="An LLM judge's score as the online reward term judge/score (docs/judge.md). null: none.")

    @model_validator(mode="after")
    def _offline_critic(self) -> "TrainConfig":
        o, c = self.offline, self.critic
        if o is None:
            return self
        if o.trains_critic and c.kind != "separate":
            raise ValueError(f"offline.algo = '{o.algo}'{' with value_pretrain' if o.value_pretrain else ''} trains "
                             f"the separate critic, got critic.kind = '{c.kind}'; set critic.kind=separate (or "
                             "offline.algo=filtered_bc without offline.value_pretrain)")
        if o.algo in ("iql", "cql") and not c.q:
            raise ValueError(f"offline.algo = '{o.algo}' learns Q(s, a) with the critic's Q head, got critic.q = "
                             "false; set critic.q=true")
        if o.algo == "none" and not o.after_bc and not self.actor.init_from:
            raise ValueError("offline.algo = 'none' trains no actor, and offline.after_bc = false skips BC: the run "
                             "would start RL from an untrained actor; set offline.after_bc=true (or actor.init_from)")
        return self

    @model_validator(mode="after")
    def _manager_kl_needs_ppo(self) -> "TrainConfig":
        h = self.hierarchy
        if h is not None and h.manager_kl and self.ppo.algo != "ppo":
            raise ValueError(f"hierarchy.manager_kl = {h.manager_kl} is a KL penalty in PPO's loss, got ppo.algo = "
                             f"'{self.ppo.algo}' (no KL term); set ppo.algo=ppo, or hierarchy.manager_kl=null")
        return self

    def manager_config(self) -> "TrainConfig":
        """The config a hierarchy's manager policy trains under: this one, with ``hierarchy.manager_kl`` (when
        set) as its ``ppo.kl_coef``."""
        h = self.hierarchy
        if h is None or h.manager_kl is None:
            return self
        return self.model_copy(update={"ppo": self.ppo.model_copy(update={"kl_coef": h.manager_kl})})

    @model_validator(mode="after")
    def _judge_guard(self) -> "TrainConfig":
        if self.judge is not None and self.judge.guard == "drop" and not self.run.diagnose_every:
            raise ValueError("judge.guard = 'drop' acts on the live check's judge_hacking warning, got "
                             "run.diagnose_every = 0 (the check off); set run.diagnose_every (e.g. 5)")
        return self


#: How to give a required field, by its dotted name (the error of a missing one says it).
FIX_MISSING = {"offline.data": "the episode JSONL files: polyturn train --offline DATA [DATA ...], or "
                               "offline.data=[a.jsonl, b.jsonl]"}


def _explain(err: ValidationError, source: str) -> ConfigError:
    lines = [f"Invalid config {source}:"]
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {field}: unknown field (check the spelling; see configs/ for valid keys)")
            continue
        if e["type"] == "missing":
            lines.append(f"  {field}: required, got none ({FIX_MISSING.get(field, 'set it in the config or with --set')})")
            continue
        got = e.get("input")
        got_s = json.dumps(got, default=str) if not isinstance(got, dict) else "{...}"
        lines.append(f"  {field} = {got_s}: {e['msg']}")
    return ConfigError("\n".join(lines))


def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _deep_merge(base.get(k), v) if k in base else v
        return out
    return over


def _set_path(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if nxt is None:  # an optional section left out (e.g. constraints): --set starts it
            nxt = node[k] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {dotted}: {k} is not a section")
        node = nxt
    node[keys[-1]] = value


def parse_overrides(pairs: list[str]) -> list[tuple[str, Any]]:
    """``["ppo.clip=0.1", "critic.kind=none"]`` -> typed pairs (values parsed as YAML scalars)."""
    out = []
    for p in pairs:
        if "=" not in p:
            raise ConfigError(f"Expected --set key=value, got {p!r}")
        k, v = p.split("=", 1)
        out.append((k.strip(), yaml.safe_load(v)))
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Load and validate a YAML config (``None``: all defaults) with ``key=value`` overrides."""
    data: dict = {}
    source = "(defaults)"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"Config file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"Config {p} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"Expected a mapping at the top of {p}, got {type(data).__name__}")
        source = str(p)
    # Merge onto the defaults so a partial section (``curriculum.gamma.end=0.95``) keeps its other fields.
    merged = _deep_merge(TrainConfig().model_dump(mode="json"), data)
    for k, v in parse_overrides(overrides or []):
        _set_path(merged, k, v)
    try:
        return TrainConfig.model_validate(merged)
    except ValidationError as e:
        raise _explain(e, source) from None


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (what was actually run)."""
    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
