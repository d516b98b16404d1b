"""From stored segments to padded tensors, and the actor's log-probs over them.

Targets are shifted: position ``i`` of the ``[S, L-1]`` tensors is the
prediction of ``ids[i+1]`` from ``ids[:i+1]``. ``action_mask`` is 1 only where
that target is a sampled action token, so prompts, observations and forced
end-of-message tokens never enter a policy loss.

Little padding: :func:`length_batches` draws an epoch's minibatches with
similar lengths together; :func:`micro_batches` splits one minibatch into
length-sorted micro-batches under a token budget, whose losses, each weighted
by its share of the minibatch (:class:`MicroStats`), accumulate to the
minibatch's gradient.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from polyturn.algos.gae import token_advantages
from polyturn.models.actor import Actor
from polyturn.rollout.types import Segment
from polyturn.train import distributed


def length_batches(lengths: Sequence[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """One epoch of index batches with little padding: shuffle, sort windows of 8 batches by length, shuffle batches."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = 8 * batch_size
    batches = []
    for w in range(0, len(order), window):
        chunk = sorted(order[w : w + window], key=lambda i: lengths[i])
        batches += [chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def micro_batches(rows: Sequence[Sequence[int]], budget: int | None, *, prefix: int = 0) -> list[list[int]]:
    """Split items into length-sorted micro-batches of at most ``budget`` padded tokens each.

    Among the splits of the length-sorted items into consecutive runs that fit
    the budget, the one with the fewest micro-batches, and with the fewest pad
    tokens among those (a dynamic programme over the sorted items, exact).

    Args:
        rows: per item (an episode, a demonstration, a critic state), the token
            lengths of its rows (segments); an item's rows stay together.
        budget: the most padded tokens (rows x longest row) per micro-batch;
            an item larger than that alone makes one. ``None``: one micro-batch.
        prefix: leading tokens every row shares and the forward pass runs once
            (``actor.shared_prefix``): a micro-batch of ``r > 1`` rows then costs
            ``prefix + r x (longest - prefix)`` tokens of the budget.

    Returns:
        Item positions per micro-batch, longest first, each micro-batch's items
        longest first; every item exactly once.
    """
    order = sorted(range(len(rows)), key=lambda i: (-max(rows[i], default=0), i))
    if budget is None:
        return [order] if order else []
    if budget < 1:
        raise ValueError(f"Expected a micro-batch token budget >= 1 (or None), got {budget}")
    longest = [max(rows[i], default=0) for i in order]
    n_rows = [len(rows[i]) for i in order]
    # best[j]: (micro-batches, pad tokens) of the best split of order[:j]; start[j]: where its last one starts.
    best: list[tuple[int, int]] = [(0, 0)]
    start: list[int] = [0]
    for j in range(1, len(order) + 1):
        cand, r, real = None, 0, 0
        for a in range(j - 1, -1, -1):  # the last micro-batch is order[a:j]; order[a] is its longest
            r += n_rows[a]
            real += sum(rows[order[a]])
            if (prefix + r * (longest[a] - prefix) if r > 1 else longest[a]) > budget and a < j - 1:
                break  # longer runs only get larger
            c = (best[a][0] + 1, best[a][1] + r * longest[a] - real)
            if cand is None or c < cand[0]:
                cand = (c, a)
        best.append(cand[0])
        start.append(cand[1])
    out, j = [], len(order)
    while j > 0:
        out.append(order[start[j] : j])
        j = start[j]
    return out[::-1]


def padded_tokens(rows: Sequence[Sequence[int]]) -> tuple[int, int]:
    """``(real, padded)`` token counts of one batch of these items' rows, right-padded to the longest row."""
    lens = [n for r in rows for n in r]
    return sum(lens), len(lens) * max(lens, default=0)


def action_tokens(segments: Sequence[Segment]) -> int:
    """Action tokens the segments put on a :class:`TokenBatch`'s target grid (a first token never is one)."""
    return sum(sum(seg.action_mask[1:]) for seg in segments)


class MicroStats:
    """A minibatch's statistics gathered over its micro-batches, and the padding they ran with.

    Each micro-batch adds its statistics with its share of the minibatch (its
    action tokens, turns or rows over the minibatch's), so the shares of one
    statistic sum to 1 and the sum is the whole minibatch's (token-)mean. Kept
    as tensors until :meth:`result`: no device synchronisation per micro-batch.
    """

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor | float] = {}
        self.real = 0
        self.padded = 0
        self._result: dict[str, float] | None = None  # result()'s floats until the next add (one collective)

    def add(self, stats: Mapping[str, torch.Tensor | float], share: float) -> None:
        """Add ``share`` times each statistic."""
        self._result = None
        for k, v in stats.items():
            v = v.detach() if isinstance(v, torch.Tensor) else v
            self.sums[k] = self.sums.get(k, 0.0) + share * v

    def count(self, rows: Sequence[Sequence[int]]) -> None:
        """Count the real and padded tokens of one micro-batch of these items' rows."""
        real, padded = padded_tokens(rows)
        self.real += real
        self.padded += padded

    @property
    def padding(self) -> float:
        """Pad positions over all positions of the micro-batches counted so far (0 when none)."""
        return 1.0 - self.real / self.padded if self.padded else 0.0

    def result(self) -> dict[str, float]:
        """The statistics as floats (summed over the torchrun processes, each of which ran its share); computed
        once per set of statistics, so every process makes the same number of collective calls."""
        if self._result is None:
            self._result = distributed.sum_stats(self.sums)
        return dict(self._result)


#: The shortest common prefix :func:`make_token_batch` marks for a shared forward pass (``actor.shared_prefix``):
#: below it, a second pass costs more than the prefix saves.
MIN_SHARED_PREFIX = 32


def common_prefix(rows: Sequence[Sequence[int]]) -> int:
    """The length of the longest prefix every row of token ids starts with, leaving each row at least one token
    after it (0 for fewer than two rows)."""
    if len(rows) < 2:
        return 0
    first, limit = rows[0], min(len(r) for r in rows) - 1
    n = 0
    while n < limit and all(r[n] == first[n] for r in rows):
        n += 1
    return n


def shareable_prefix(rows: Sequence[Sequence[int]]) -> int:
    """:func:`common_prefix` when it is at least :data:`MIN_SHARED_PREFIX` tokens, else 0 (not worth a second pass)."""
    n = common_prefix(rows)
    return n if n >= MIN_SHARED_PREFIX else 0


class TokenBatch(NamedTuple):
    """Right-padded segments of several episodes; ``shared``: leading tokens every row holds the same (0: none
    marked), which :func:`policy_output` runs once for all rows."""

    input_ids: torch.Tensor  # [S, L] long
    attention_mask: torch.Tensor  # [S, L] long
    action_mask: torch.Tensor  # [S, L-1] float, 1 on sampled target tokens
    turn_index: torch.Tensor  # [S, L-1] long, turn of each target token (-1 elsewhere)
    old_logprobs: torch.Tensor  # [S, L-1] float, behaviour log-probs of target tokens
    episode_index: torch.Tensor  # [S] long, which episode each segment belongs to
    shared: int = 0  # leading tokens all rows share, computed once (actor.shared_prefix)

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())


def make_token_batch(items: Sequence[tuple[int, Segment]], *, pad_id: int,
                     device: torch.device | str | None = None, share_prefix: bool = False) -> TokenBatch:
    """Pad ``(episode_index, segment)`` pairs into a :class:`TokenBatch` (on ``device``, default CPU);
    ``share_prefix``: mark the rows' :func:`shareable_prefix` for one shared forward pass."""
    if not items:
        raise ValueError("Expected at least one segment, got none")
    n = max(len(seg) for _, seg in items)
    s = len(items)
    ids = torch.full((s, n), pad_id, dtype=torch.long)
    attn = torch.zeros(s, n, dtype=torch.long)
    amask = torch.zeros(s, n, dtype=torch.float32)
    tidx = torch.full((s, n), -1, dtype=torch.long)
    olp = torch.zeros(s, n, dtype=torch.float32)
    for r, (_, seg) in enumerate(items):
        k = len(seg)
        ids[r, :k] = torch.tensor(seg.ids, dtype=torch.long)
        attn[r, :k] = 1
        amask[r, :k] = torch.tensor(seg.action_mask, dtype=torch.float32)
        tidx[r, :k] = torch.tensor(seg.turn_index, dtype=torch.long)
        olp[r, :k] = torch.tensor(seg.logprobs, dtype=torch.float32)
    # The first token of a segment is never an action (segments start with the prompt).
    batch = TokenBatch(
        input_ids=ids,
        attention_mask=attn,
        action_mask=amask[:, 1:],
        turn_index=tidx[:, 1:],
        old_logprobs=olp[:, 1:],
        episode_index=torch.tensor([e for e, _ in items], dtype=torch.long),
    )
    if share_prefix:
        batch = batch._replace(shared=shareable_prefix([seg.ids for _, seg in items]))
    if device is not None and torch.device(device).type != "cpu":
        batch = TokenBatch(*(t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t for t in batch))
    return batch


class PolicyOutput(NamedTuple):
    """The actor's view of a :class:`TokenBatch`, on the ``[S, L-1]`` target grid (0 off action tokens)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    correct: torch.Tensor  # 1 where the argmax is the target (BC accuracy)
    hidden: torch.Tensor  # [S, L, H] last hidden states (for the shared critic's value head)


def policy_output(actor: Actor, batch: TokenBatch, *, temperature: float = 1.0) -> PolicyOutput:
    """Log-probs, entropies and argmax hits of the target tokens, computing logits at action tokens only."""
    t = temperature if temperature > 0 else 1.0
    hidden = actor.hidden_states(batch.input_ids, batch.attention_mask, prefix=batch.shared)
    sel = batch.action_mask.bool()
    logits = actor.head(hidden[:, :-1][sel]).float() / t  # [N, V]
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = batch.input_ids[:, 1:][sel]
    lp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    hit = (logits.argmax(-1) == targets).float()

    def grid(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(sel.shape, dtype=x.dtype, device=x.device).masked_scatter(sel, x)

    return PolicyOutput(logprobs=grid(lp), entropy=grid(ent), correct=grid(hit.detach()), hidden=hidden)


def actor_logprobs(actor: Actor, batch: TokenBatch, *, temperature: float = 1.0) -> torch.Tensor:
    """The actor's log-probs ``[S, L-1]`` of the action tokens (0 elsewhere), with gradients."""
    return policy_output(actor, batch, temperature=temperature).logprobs


def segment_advantages(turn_adv: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """Every action token of turn t gets turn t's advantage; ``turn_adv`` is ``[E, T]`` over episodes."""
    turn_adv = turn_adv.to(batch.action_mask.device)
    return token_advantages(turn_adv[batch.episode_index], batch.turn_index) * batch.action_mask
