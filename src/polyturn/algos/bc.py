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
