"""An action-level critic built on a causal LM: scores (dialogue so far, candidate turn, privileged text).

Two parametrisations of the turn score (config ``param``):

* ``log_ratio`` (SWEET-RL, Zhou et al. 2025): the mean, over the candidate
  turn's tokens, of ``log p_critic(token) - log p_ref(token)``, with ``ref`` a
  frozen copy of the critic's starting weights. At the start every score is 0;
  training moves the critic LM's likelihood of good turns up relative to the
  reference. The score uses the LM head the model was pretrained with, so a
  pretrained critic starts from its language knowledge, not from a random head.
* ``head``: a linear head on the hidden state of the turn's last token.

The prompt is the critic text of :mod:`polyturn.models.critic_text` (privileged
text first when ``include_privileged``, then the task and the recent turns),
cut to ``max_len`` by that module's truncation policy: the privileged text, the
task and the candidate turn survive, the oldest turns go first.
Saved as an HF-format directory: ``model/`` (``AutoModelForCausalLM``),
``ref/`` (log_ratio), ``tokenizer/``, ``head.safetensors`` and ``critic_config.json``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from polyturn.models.critic_text import CriticInput, critic_segments, fit_parts

CONFIG_NAME = "critic_config.json"
HEAD_NAME = "head.safetensors"
#: Tokens of the candidate turn kept at most (its beginning; the prompt fills the rest of max_len).
MAX_ACTION_TOKENS = 96


@dataclass
class CausalCriticConfig:
    """What :meth:`CausalCritic.from_pretrained` needs besides the weights."""

    kind: str = "causal"
    param: Literal["log_ratio", "head"] = "log_ratio"
    include_privileged: bool = True
    max_len: int = 384
    #: Freeze the input embeddings and the first N decoder layers (autograd records nothing below layer N, so they
    #: cost a forward pass only). SmolLM2 ties its LM head to the embeddings: frozen too.
    freeze_layers: int = 0


class CausalCritic(nn.Module):
    """A causal LM scoring candidate turns; see the module docstring for the two parametrisations."""

    def __init__(self, *, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: CausalCriticConfig,
                 ref: PreTrainedModel | None = None) -> None:
        super().__init__()
        if config.param not in ("log_ratio", "head"):
            raise ValueError(f"Expected critic param in ('log_ratio', 'head'), got {config.param!r}")
        self.config = config
        self.tokenizer = tokenizer
        self.model = model
        if config.param == "log_ratio":
            # Frozen: no gradient, so no optimizer or gradient clip picks it up; moves with the critic (.to).
            self.ref = (ref if ref is not None else copy.deepcopy(model)).requires_grad_(False).eval()
        else:
            self.head = nn.Linear(model.config.hidden_size, 1)
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
        self._apply_freeze()

    def _apply_freeze(self) -> None:
        n = self.config.freeze_layers
        if n == 0:
            return
        layers = getattr(getattr(self.model, "model", None), "layers", None)
        if layers is None or not 0 <= n <= len(layers):
            have = "no model.layers" if layers is None else f"{len(layers)} layers"
            raise ValueError(f"Expected 0 <= critic freeze_encoder_layers <= the causal LM's decoder layers, got {n} "
                             f"({type(self.model).__name__}: {have})")
        self.model.get_input_embeddings().requires_grad_(False)
        for layer in layers[:n]:
            layer.requires_grad_(False)

    @property
    def include_privileged(self) -> bool:
        """Whether this critic reads privileged (training-time) text."""
        return self.config.include_privileged

    def train(self, mode: bool = True) -> CausalCritic:
        """Train mode for the critic LM (and head); the frozen reference stays in eval mode."""
        super().train(mode)
        if self.config.param == "log_ratio":
            self.ref.eval()
        return self

    def encode(self, inputs: Sequence[CriticInput]) -> dict[str, Tensor]:
        """Right-padded ``input_ids``, ``attention_mask`` and ``action_mask`` (1 on the candidate turn's tokens)."""
        rows, acts = [], []
        for inp in inputs:
            if inp.action is None:
                raise ValueError("Expected every CriticInput to carry a candidate action, got action=None")
            state = CriticInput(inp.task, inp.history, inp.privileged, None, inp.features)
            segs = critic_segments(state, include_privileged=self.include_privileged)
            ids = self.tokenizer([text for _, text in segs], add_special_tokens=False, verbose=False)["input_ids"]
            parts: dict[str, list[int]] = {"privileged": [], "task": []}
            turns = []
            for (kind, _), piece in zip(segs, ids):
                if kind == "turn":
                    turns.append(list(piece))
                else:
                    parts[kind] = list(piece)
            action = self.tokenizer(" " + inp.action.strip(), add_special_tokens=False)["input_ids"][:MAX_ACTION_TOKENS]
            action = action or [self.tokenizer.pad_token_id or 0]
            # The privileged text, the task and the candidate survive; the oldest turns go first (critic_text).
            prompt, action = fit_parts(parts["privileged"], parts["task"], action, turns, self.config.max_len)
            rows.append(prompt + action)
            acts.append(len(action))
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        att = torch.zeros(len(rows), width, dtype=torch.long)
        am = torch.zeros(len(rows), width, dtype=torch.long)
        for i, (r, n) in enumerate(zip(rows, acts)):
            ids[i, : len(r)] = torch.tensor(r)
            att[i, : len(r)] = 1
            am[i, len(r) - n : len(r)] = 1
        return {"input_ids": ids, "attention_mask": att, "action_mask": am}

    @staticmethod
    def _token_logprobs(model: PreTrainedModel, ids: Tensor, att: Tensor) -> Tensor:
        """``[B, L]``: log-prob of token i given tokens < i (0 at i = 0)."""
        logits = model(input_ids=ids, attention_mask=att).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        return torch.cat([torch.zeros_like(lp[:, :1]), lp], 1)

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``{"score": [B]}`` float32 for a batch from :meth:`encode` (gradients flow to the critic LM / head)."""
        device = next(self.model.parameters()).device
        ids, att = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        am = batch["action_mask"].to(device).float()
        if self.config.param == "log_ratio":
            lp = self._token_logprobs(self.model, ids, att)
            with torch.no_grad():
                ref = self._token_logprobs(self.ref, ids, att)
            score = ((lp - ref) * am).sum(1) / am.sum(1).clamp_min(1.0)
        else:
            out = self.model(input_ids=ids, attention_mask=att, output_hidden_states=True)
            last = att.sum(1) - 1
            h = out.hidden_states[-1][torch.arange(ids.shape[0], device=device), last].float()
            score = self.head(h).squeeze(-1)
        return {"score": score}

    def scores(self, inputs: Sequence[CriticInput], *, batch_size: int = 32) -> Tensor:
        """Turn scores ``[N]`` float32 in input order (gradients flow unless under ``torch.no_grad()``)."""
        if batch_size < 1:
            raise ValueError(f"Expected batch_size >= 1, got {batch_size}")
        out = [self(self.encode(inputs[s : s + batch_size]))["score"] for s in range(0, len(inputs), batch_size)]
        return torch.cat(out) if out else torch.zeros(0)

    def save_pretrained(self, path: str | Path) -> None:
        """Write the HF-format directory described in the module docstring."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / CONFIG_NAME).write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        self.model.save_pretrained(path / "model")
        self.tokenizer.save_pretrained(path / "tokenizer")
        if self.config.param == "log_ratio":
            self.ref.save_pretrained(path / "ref")
        else:
            save_file({k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()},
                      str(path / HEAD_NAME))

    @classmethod
    def from_pretrained(cls, path: str | Path) -> CausalCritic:
        """Load a critic written by :meth:`save_pretrained` (on CPU, float32)."""
        path = Path(path)
        raw = json.loads((path / CONFIG_NAME).read_text())
        if raw.get("kind") != "causal":
            raise ValueError(f"Expected critic kind 'causal' in {path / CONFIG_NAME}, got {raw.get('kind')!r}")
        config = CausalCriticConfig(**raw)
        model = AutoModelForCausalLM.from_pretrained(path / "model", dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(path / "tokenizer")
        ref = None
        if config.param == "log_ratio":
            ref = AutoModelForCausalLM.from_pretrained(path / "ref", dtype=torch.float32)
        critic = cls(model=model, tokenizer=tok, config=config, ref=ref)
        if config.param == "head":
            critic.head.load_state_dict(load_file(str(path / HEAD_NAME)))
        return critic
