"""Action-level critics behind one interface: ``scores(inputs) -> [N]`` turn scores, ``save_pretrained``, loading.

* :class:`EncoderActionCritic` — the BERT encoders of :mod:`polyturn.models.critic`
  (scratch or MiniLM) with their Q head: one pass reads the state and the
  candidate turn; the Q output is the turn's score.
* :class:`polyturn.models.causal_critic.CausalCritic` — a causal LM (SmolLM2, any
  local HF causal LM, or a small config-built Llama).

:func:`load_action_critic` opens either from its directory (``critic_config.json`` says which).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor, nn

from polyturn.models.causal_critic import CONFIG_NAME, CausalCritic
from polyturn.models.critic import SeparateCritic
from polyturn.models.critic_text import CriticInput


class EncoderActionCritic(nn.Module):
    """A :class:`SeparateCritic` built with ``q=True``; a candidate turn's score is its Q output."""

    def __init__(self, critic: SeparateCritic) -> None:
        super().__init__()
        if not critic.config.q:
            raise ValueError("Expected a SeparateCritic built with q=True (it scores the action), got q=False")
        self.critic = critic

    @property
    def include_privileged(self) -> bool:
        """Whether this critic reads privileged (training-time) text."""
        return self.critic.config.include_privileged

    def scores(self, inputs: Sequence[CriticInput], *, batch_size: int = 64) -> Tensor:
        """Turn scores ``[N]`` float32 in input order (gradients flow unless under ``torch.no_grad()``)."""
        return self.critic.q_values(inputs, batch_size=batch_size)

    def save_pretrained(self, path: str | Path) -> None:
        """The encoder critic's own directory format (:meth:`SeparateCritic.save_pretrained`)."""
        self.critic.save_pretrained(path)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> EncoderActionCritic:
        return cls(SeparateCritic.from_pretrained(path))


ActionCritic = EncoderActionCritic | CausalCritic


def load_action_critic(path: str | Path) -> ActionCritic:
    """Open an action-level critic directory (a checkpoint's ``critic/``, the checkpoint, or a run: its latest)."""
    path = Path(path)
    if (path / "latest").is_file() and not (path / "critic").is_dir():
        path = path / (path / "latest").read_text().strip()
    if (path / "critic" / CONFIG_NAME).is_file():
        path = path / "critic"
    if not (path / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"Expected an action critic directory holding {CONFIG_NAME} (a checkpoint trained "
                                f"with critic.kind: action, or its critic/ folder), got {path}")
    raw = json.loads((path / CONFIG_NAME).read_text())
    if raw.get("kind") == "causal":
        return CausalCritic.from_pretrained(path)
    if raw.get("kind") == "separate" and raw.get("q"):
        return EncoderActionCritic.from_pretrained(path)
    raise ValueError(f"Expected an action critic (kind 'causal', or 'separate' with q: true) in {path / CONFIG_NAME}, "
                     f"got kind {raw.get('kind')!r} with q {raw.get('q')!r}: a state-value critic ranks no actions; "
                     "train one with critic.kind: action")
