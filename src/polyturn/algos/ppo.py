"""Token-level policy-gradient losses: PPO-clip and its one-step special case A2C.

Every per-token tensor is ``[B, L]`` over a token sequence; ``mask`` is 1 only
on tokens the actor sampled (action tokens) and 0 on prompt, observation,
tool-output and padding tokens. Masked-out positions contribute nothing to any
returned value or gradient, whatever they hold (NaN and inf included).
"""

from __future__ import annotations

import torch
from torch import Tensor

from polyturn.algos._validate import as_bool_mask, check_float, check_like, check_positive
from polyturn.algos.masked import Agg, aggregate, masked_mean


def _entropy_term(
    entropy: Tensor | None, ent_coef: float, m: Tensor, ref: Tensor, agg: Agg
) -> Tensor | None:
    if entropy is None:
        if ent_coef != 0.0:
            raise ValueError(f"Expected an entropy tensor when ent_coef != 0, got None (ent_coef={ent_coef})")
        return None
    entropy = check_like("entropy", entropy, "logprobs", ref)
    return aggregate(entropy, m, agg)


def ppo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    entropy: Tensor | None = None,
    ent_coef: float = 0.0,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    agg: Agg = "token_mean",
    behaviour_logprobs: Tensor | None = None,
    behaviour_weight_cap: float | None = None,
) -> dict[str, Tensor]:
    """PPO-clip over action tokens, with optional entropy bonus and KL to a reference.

    Per token, with ``ratio = exp(logprobs - old_logprobs)``::

        pg = max(-A * ratio, -A * clamp(ratio, 1 - clip_eps, 1 + clip_eps_high))
        pg = min(pg, -A * dual_clip)    where A < 0, with ``dual_clip`` (dual-clip PPO, Ye et al. 2020)
        loss = agg(pg) - ent_coef * agg(entropy) + kl_coef * agg(k3)
        k3 = exp(ref - logprobs) - 1 - (ref - logprobs)     # >= 0, estimates KL(pi || ref)

    Decoupled PPO (Hilton et al. 2022, as AReaL runs it for stale rollouts), when ``behaviour_logprobs`` is
    given: ``old_logprobs`` are then the *proximal* policy's (the learner's weights when the update starts), the
    clip range is centred on them, and each token's ``pg`` is multiplied by the off-policy weight
    ``w = exp(old_logprobs - behaviour_logprobs)`` (no grad); a token with ``w > behaviour_weight_cap`` is left
    out (weight 0), as AReaL does. On fresh samples ``w = 1`` and the loss is plain PPO's.

    Args:
        logprobs: ``[B, L]`` float, log-probs of the sampled tokens under the
            current policy (differentiable).
        old_logprobs: ``[B, L]`` float, the behaviour log-probs recorded at
            sampling time.
        advantages: ``[B, L]`` float, each action token's advantage (see
            :func:`polyturn.algos.token_advantages`).
        mask: ``[B, L]`` bool or 0/1; 1 only on sampled action tokens.
        clip_eps: lower clip range, ratio >= 1 - clip_eps; in (0, 1).
        clip_eps_high: upper clip range ("clip-higher"); ``None`` uses ``clip_eps``.
        dual_clip: for negative advantages, the ratio past which a token's loss stops growing (and its
            gradient is 0): a token the policy made far likelier than it was when sampled (a rare or
            epsilon-forced token, whose log-prob moves most under a small change of the logits) cannot
            dominate the minibatch's gradient. Greater than ``1 + clip_eps_high``; ``None``: off.
        entropy: ``[B, L]`` float, the policy's entropy at each token; needed
            when ``ent_coef != 0``, logged whenever given.
        ent_coef: weight of the entropy bonus (subtracted from the loss).
        ref_logprobs: ``[B, L]`` float, log-probs of the sampled tokens under a
            frozen reference policy; needed when ``kl_coef != 0``.
        kl_coef: weight of the KL penalty to the reference.
        agg: how per-token terms become scalars, see :data:`polyturn.algos.masked.Agg`.
        behaviour_logprobs: ``[B, L]`` float, the log-probs recorded at sampling time, for decoupled PPO
            (above); ``None``: ``old_logprobs`` are the behaviour policy's and there is no extra weight.
        behaviour_weight_cap: decoupled PPO's largest off-policy weight (``None``: no cap).

    Returns:
        A dict of scalar tensors:

        * ``loss``: the total to minimize (differentiable);
        * ``policy_loss``: the clipped surrogate term;
        * ``entropy``: aggregated entropy (only when ``entropy`` is given);
        * ``kl_ref``: aggregated k3 KL to the reference (only when
          ``ref_logprobs`` is given);
        * ``approx_kl``: mean over action tokens of ``(ratio - 1) - log ratio``,
          an estimate of KL(old || new) (no grad);
        * ``clipfrac``: fraction of action tokens where clipping is active,
          i.e. the clipped term was chosen and its gradient is 0 (no grad);
        * ``dual_clipfrac``: fraction of action tokens cut by ``dual_clip`` (only when it is set; no grad);
        * ``ratio_mean``: mean ratio over action tokens (no grad);
        * ``behaviour_weight``, ``behaviour_capped``: decoupled PPO's mean off-policy weight and the share of
          action tokens left out by the cap (only with ``behaviour_logprobs``; no grad).
    """
    logprobs = check_float("logprobs", logprobs)
    old_logprobs = check_like("old_logprobs", old_logprobs, "logprobs", logprobs)
    advantages = check_like("advantages", advantages, "logprobs", logprobs)
    m = as_bool_mask("mask", mask, logprobs.shape, "logprobs")
    if not 0.0 < clip_eps < 1.0:
        raise ValueError(f"Expected clip_eps in (0, 1), got {clip_eps}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    check_positive("clip_eps_high", high)
    if dual_clip is not None and not dual_clip > 1.0 + high:
        raise ValueError(f"Expected dual_clip > 1 + clip_eps_high = {1.0 + high}, got {dual_clip}")

    # Select before exp so garbage at masked positions (e.g. -inf padding) never reaches the graph.
    log_ratio = torch.where(m, logprobs - old_logprobs, 0.0)
    adv = torch.where(m, advantages, 0.0)
    ratio = log_ratio.exp()
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + high)
    pg = torch.maximum(pg_unclipped, pg_clipped)
    if dual_clip is not None:
        cut = (adv < 0) & (pg > -adv * dual_clip)
        pg = torch.where(cut, (-adv * dual_clip).detach(), pg)
    if behaviour_logprobs is not None:
        behaviour_logprobs = check_like("behaviour_logprobs", behaviour_logprobs, "logprobs", logprobs)
        if behaviour_weight_cap is not None:
            check_positive("behaviour_weight_cap", behaviour_weight_cap)
        with torch.no_grad():
            weight = torch.where(m, old_logprobs - behaviour_logprobs, 0.0).exp()
            capped = m & (weight > behaviour_weight_cap) if behaviour_weight_cap is not None else torch.zeros_like(m)
            weight = torch.where(capped, 0.0, weight)
        pg = pg * weight
    policy_loss = aggregate(pg, m, agg)

    out: dict[str, Tensor] = {"policy_loss": policy_loss}
    loss = policy_loss
    ent = _entropy_term(entropy, ent_coef, m, logprobs, agg)
    if ent is not None:
        loss = loss - ent_coef * ent
        out["entropy"] = ent
    if ref_logprobs is None:
        if kl_coef != 0.0:
            raise ValueError(f"Expected ref_logprobs when kl_coef != 0, got None (kl_coef={kl_coef})")
    else:
        ref_logprobs = check_like("ref_logprobs", ref_logprobs, "logprobs", logprobs)
        log_ref_ratio = torch.where(m, ref_logprobs - logprobs, 0.0)
        kl_ref = aggregate(log_ref_ratio.exp() - 1.0 - log_ref_ratio, m, agg)
        loss = loss + kl_coef * kl_ref
        out["kl_ref"] = kl_ref
    with torch.no_grad():
        out["approx_kl"] = masked_mean((ratio - 1.0) - log_ratio, m)
        out["clipfrac"] = masked_mean((pg_clipped > pg_unclipped).to(logprobs.dtype), m)
        out["ratio_mean"] = masked_mean(ratio, m)
        if dual_clip is not None:
            out["dual_clipfrac"] = masked_mean(cut.to(logprobs.dtype), m)
        if behaviour_logprobs is not None:
            out["behaviour_weight"] = masked_mean(weight, m)
            out["behaviour_capped"] = masked_mean(capped.to(logprobs.dtype), m)
    return {"loss": loss, **out}


def a2c_loss(
    logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    entropy: Tensor | None = None,
    ent_coef: float = 0.0,
    agg: Agg = "token_mean",
) -> dict[str, Tensor]:
    """Vanilla advantage policy gradient ``-A * logprobs`` over action tokens.

    The on-policy, single-update special case of :func:`ppo_loss`: at
    ``ratio == 1`` both have the same gradient (their values differ).

    Args:
        logprobs: ``[B, L]`` float, log-probs of the sampled tokens (differentiable).
        advantages: ``[B, L]`` float, per-token advantages.
        mask: ``[B, L]`` bool or 0/1; 1 only on sampled action tokens.
        entropy: ``[B, L]`` float, optional per-token entropy.
        ent_coef: weight of the entropy bonus (subtracted from the loss).
        agg: see :data:`polyturn.algos.masked.Agg`.

    Returns:
        ``loss``, ``policy_loss`` and, when ``entropy`` is given, ``entropy``.
    """
    logprobs = check_float("logprobs", logprobs)
    advantages = check_like("advantages", advantages, "logprobs", logprobs)
    m = as_bool_mask("mask", mask, logprobs.shape, "logprobs")
    pg = -torch.where(m, advantages, 0.0) * torch.where(m, logprobs, 0.0)
    policy_loss = aggregate(pg, m, agg)
    out: dict[str, Tensor] = {"loss": policy_loss, "policy_loss": policy_loss}
    ent = _entropy_term(entropy, ent_coef, m, logprobs, agg)
    if ent is not None:
        out["loss"] = policy_loss - ent_coef * ent
        out["entropy"] = ent
    return out
