"""Behaviour cloning: masked token cross-entropy on demonstration actions.

The model layer runs the actor on the demonstration's token sequence and
gathers the log-prob of each *next* target token (``log_softmax(logits)`` at
the target id); this module only sees those gathered log-probs, so it does not
care about vocabulary size, logit shifting or chunked computation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyturn.algos._validate import as_bool_mask, check_float
from polyturn.algos.masked import Agg, aggregate, masked_mean


def bc_loss(
    logprobs: Tensor,
    mask: Tensor,
    *,
    correct: Tensor | None = None,
    agg: Agg = "token_mean",
) -> dict[str, Tensor]:
    """Negative log-likelihood of the demonstrated action tokens.

    Args:
        logprobs: ``[B, L]`` float, log-prob the actor gives each target token
            (differentiable).
        mask: ``[B, L]`` bool or 0/1; 1 only on the demonstration's action
            tokens (the agent's turns), 0 on prompt, observations, tool output
            and padding, so the actor never learns to imitate the environment.
        correct: ``[B, L]`` bool or 0/1, optional: 1 where the target token is
            the actor's argmax; gives the ``token_accuracy`` diagnostic.
        agg: see :data:`polyturn.algos.masked.Agg`.

    Returns:
        ``loss`` (aggregated NLL, differentiable), ``perplexity``
        (``exp`` of the token-mean NLL, no grad) and, when ``correct`` is
        given, ``token_accuracy`` (fraction of action tokens predicted
        exactly, no grad).
    """
    logprobs = check_float("logprobs", logprobs)
    m = as_bool_mask("mask", mask, logprobs.shape, "logprobs")
    nll = -logprobs
    out = {"loss": aggregate(nll, m, agg)}
    with torch.no_grad():
        out["perplexity"] = masked_mean(nll, m).exp()
        if correct is not None:
            hit = as_bool_mask("correct", correct, logprobs.shape, "logprobs")
            out["token_accuracy"] = masked_mean(hit.to(logprobs.dtype), m)
    return out


def action_unlikelihood(logprobs: Tensor, action_id: Tensor, *, max_prob: float = 1 - 1e-6) -> dict[str, Tensor]:
    """Sequence-level unlikelihood of whole actions: the mean over actions of ``-log(1 - p(action))``.

    An action's probability is the product of its tokens' probabilities, so an unlikely action costs almost
    nothing and a likely one (the greedy repeat a policy loops on) costs most: the loss pushes down what the
    policy would do again, and it is bounded where ``-log p`` ascent is not.

    Args:
        logprobs: ``[B, L]`` float, log-prob of each target token (differentiable).
        action_id: ``[B, L]`` integer: which action (0..A-1) each token belongs to, -1 on tokens of no action
            here (context, padding, actions not pushed down). An action's tokens may span rows.
        max_prob: ``p(action)`` is clamped to this, so a certain action's loss stays finite.

    Returns:
        ``loss`` (differentiable; 0 with no action), ``action_prob`` (mean ``p(action)``, no grad) and
        ``actions`` (their count).
    """
    logprobs = check_float("logprobs", logprobs)
    if action_id.shape != logprobs.shape or action_id.is_floating_point() or action_id.dtype == torch.bool:
        raise ValueError(f"Expected an integer action_id shaped like logprobs {tuple(logprobs.shape)}, got "
                         f"{action_id.dtype} {tuple(action_id.shape)}")
    sel = action_id >= 0
    ids, which = torch.unique(action_id[sel], return_inverse=True)  # the actions present, each token's own
    if ids.numel() == 0:
        zero = logprobs.sum() * 0.0
        return {"loss": zero, "action_prob": zero.detach(), "actions": zero.detach()}
    seq = torch.zeros(ids.numel(), dtype=logprobs.dtype, device=logprobs.device).index_add(0, which, logprobs[sel])
    p = seq.exp().clamp(max=max_prob)
    loss = -torch.log1p(-p)
    return {"loss": loss.mean(), "action_prob": p.detach().mean(), "actions": torch.tensor(float(p.numel()))}
