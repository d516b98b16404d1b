"""What a training-health check reports: :class:`TrainingWarning`, the seed's remedies, the printed form.

The checks themselves are in :mod:`polyturn.health.checks`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Kind = Literal["reward_spike", "reward_hacking", "judge_hacking", "collapse", "low_diversity", "oscillation", "plateau",
               "critic_divergence", "critic_not_converging"]

#: The diagnose figure that shows each kind's evidence.
PLOTS: dict[str, str] = {"reward_spike": "rewards.png", "reward_hacking": "rewards.png", "judge_hacking": "rewards.png"}

REMEDIES: dict[str, str] = {
    "reward_spike": (
        "Find the term that jumped in the reward curves; check its rule for a bug or an exploit, and simplify the "
        "reward function so that it stays strongly tied to the final goal (seed 000, 4.4)."
    ),
    "reward_hacking": (
        "The reward has a loophole: re-examine this term's rule so that it pays for the useful result an action "
        "brings (outcome-based), not for doing the action; lower or remove its weight "
        "(env.kwargs.reward_weights) and keep sub-goal terms paid once per episode (seed 000, 4.4)."
    ),
    "judge_hacking": (
        "The LLM judge's reward has a loophole: read the episodes it scores highest that failed (the judge's reply is "
        "in the verdict cache); lower judge.weight or drop the judge term (judge: null) so the env's outcome leads; "
        "make the rubric (the env spec's task_description) name what the policy exploits, or use a stronger judge "
        "model; watch judge/agreement and judge/auc (docs/judge.md)."
    ),
    "collapse": (
        "Raise exploration: sampling temperature (curriculum.temperature), epsilon (curriculum.epsilon) and an "
        "entropy bonus (curriculum.ent_coef); if updates are large, lower actor.lr or ppo.clip and raise "
        "ppo.episodes_per_iter (seed 000, 4.4: late-stage plateau / incoherent behaviour)."
    ),
    "low_diversity": (
        "The collected episodes repeat each other: raise curriculum.temperature / curriculum.epsilon or add an "
        "entropy bonus (curriculum.ent_coef) so that the batch mixes successful and failed trajectories; draw more "
        "distinct tasks per iteration (ppo.episodes_per_iter, and a smaller critic.group_size for kind none) "
        "(seed 000, 4.4)."
    ),
    "oscillation": (
        "The policy steps too far each update: lower actor.lr, ppo.clip or ppo.target_kl, raise "
        "ppo.episodes_per_iter (a bigger batch) and ppo.minibatch_episodes; keep actor.warmup_steps (seed 000, 4.4: "
        "incoherent behaviour / unstable actor)."
    ),
    "plateau": (
        "Training stopped improving: if the actor does not move, check actor.lr (and that the gradients reach it); "
        "otherwise explore more (curriculum.temperature, curriculum.epsilon, an entropy bonus curriculum.ent_coef), "
        "make sure the batches mix successful and failed trajectories, or use a larger actor (actor.preset) or "
        "critic (critic.hidden / critic.layers, critic.encoder) (seed 000, 4.4: late-stage plateau)."
    ),
    "critic_divergence": (
        "Lower the critic's learning rate (critic.lr, well below actor.lr); check the V_target computation "
        "(gamma, terminal rewards, episode-termination logic) by printing V_target and V(S) for whole episodes "
        "(the table in diagnose.md); use the target network with soft updates (critic.target: td, "
        "critic.tau: 0.005) (seed 000, 4.4)."
    ),
    "critic_not_converging": (
        "The critic is not learning the returns: check V_target (the table in diagnose.md: gamma, terminal rewards, "
        "termination), raise critic.epochs or critic.lr a little if the loss is merely flat (lower it if it "
        "oscillates), give the critic more data (ppo.episodes_per_iter) or capacity (critic.hidden, critic.layers, "
        "critic.encoder: minilm); consider critic.privileged: true (seed 000, 4.4)."
    ),
}


@dataclass
class TrainingWarning:
    """A detected problem: what, where (RL iterations), the figures, the plot that shows it, and what to do."""

    kind: Kind
    metric: str
    message: str
    start_iter: int | None = None
    end_iter: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def remedy(self) -> str:
        """The remedy for this kind of problem (seed 000, 4.4)."""
        return REMEDIES[self.kind]

    @property
    def plot(self) -> str:
        """The diagnose figure (a PNG name) whose curves show the evidence."""
        return "diagnose.md" if self.metric == "actions" else PLOTS.get(self.kind, "training.png")

    @property
    def where(self) -> str:
        """``iterations A-B`` (or ``iteration A``), empty when the warning has no iterations."""
        if self.start_iter is None:
            return ""
        if self.end_iter is None or self.end_iter == self.start_iter:
            return f"iteration {self.start_iter}"
        return f"iterations {self.start_iter}-{self.end_iter}"


def warning(kind: Kind, metric: str, message: str, start: int | None, end: int | None,
            **evidence: Any) -> TrainingWarning:
    """A :class:`TrainingWarning` with ``evidence`` given as keywords."""
    return TrainingWarning(kind, metric, message, start, end, evidence)


def updates_per_iter(cfg: Any) -> int:
    """Actor optimizer steps per RL iteration of a :class:`~polyturn.config.TrainConfig`."""
    p = cfg.ppo
    epochs = 1 if p.algo == "a2c" else p.epochs
    return epochs * math.ceil(p.episodes_per_iter / p.minibatch_episodes)


def format_warning(w: TrainingWarning, *, plot_dir: str | Path, drawn_by: str | None = None) -> str:
    """One warning as the CLI prints it: kind, metric, the iterations and figures, the plot, the remedy.

    ``drawn_by`` names the command that draws the plot when it is not drawn yet.
    """
    plot = str(Path(plot_dir) / w.plot) + (f" (drawn by {drawn_by})" if drawn_by and w.plot.endswith(".png") else "")
    return f"{w.kind} [{w.metric}] {w.message}\n  plot: {plot}\n  remedy: {w.remedy}"
