"""Refusal preference pairs (``ppo.refusal_pairs``): DPO of the expert's refusal over the forbidden write, each pair
from one state, beside the update's own loss.

No CustomerService run has refused a forbidden request: rft imitates sampled successes, and a refusal is rarely
sampled, so nothing pushes toward it. Here the environment says where a request is forbidden and must be refused
now (``info["forbidden"]`` of the step that led to the state), and its spec's ``refusals`` hook
(:attr:`polyturn.envs.spec.EnvSpec.refusals`) writes the expert's refusal there, in the style of
``bc.expert_options``, and the forbidden write. Every turn of the iteration's episodes taken at such a state gives
one pair from that one context (:func:`refusal_pairs`):

* chosen: the expert's refusal, tokenized as demonstrations are
  (:func:`~polyturn.rollout.context.written_action_ids`);
* rejected: the step that carries the request on instead, as the hook writes it: before the customer's yes,
  saying what it will do and asking for one (the turn where the decision is made: refusing replaces it), after
  it the forbidden write, or the turn the policy sampled there when it called the write's tool (its own ids);
  with ``rejected: fork`` cut after its first token that leaves
  the refusal, and DPO reads the chosen turn through the same token: the tokens before the fork are both turns'
  and cancel in DPO's difference, so the loss is the decision at the fork alone (a whole chosen turn let the
  margin grow on the refusal's tokens after the fork while the fork did not move; docs/envs/customer-service.md).

Pairs only where a request must be refused teach refusing, not where: with ``contrast: N`` (the env's spec names a
``contrasts`` hook, :attr:`~polyturn.envs.spec.EnvSpec.contrasts`) up to N more pairs come from the states the env
marks ``info["allowed"]`` (an allowed request, its facts in hand): the expert's next step there chosen over a
refusal (:func:`contrast_pairs`). The NLL term then also pulls up the expert's step.

An iteration keeps at most ``max_pairs`` (``first``: the sampled writes first, or the decisions). Beside each
minibatch of the update (rft's NLL, PPO's clipped loss) ``weight`` x (DPO against the frozen reference policy RL
starts from, as turn-DPO's ``bc`` reference, + ``nll`` x the token-mean NLL of the refusals), over up to
``ppo.minibatch_episodes`` pairs drawn at random, in micro-batches of ``actor.microbatch_tokens``; an iteration with
pairs and nothing else to train on (rft without a success) still steps on them. Logged: ``refusal/states``,
``refusal/pairs``, ``refusal/sampled_writes``, ``refusal/decisions``, the term's ``refusal/dpo_loss``, ``refusal/nll``,
``refusal/accuracy`` and ``refusal/margin`` (the implicit reward gap), and before and after the update
``refusal/logp_*`` (the refusal's summed log-prob), ``refusal/gap_*`` (its log-prob minus the write's) and
``refusal/choice_*`` (its probability against the write, ``sigmoid(log p(refusal) - log p(write))``); with contrast
pairs ``refusal/contrast_states``, ``refusal/contrast_pairs`` and ``refusal/contrast_gap_*`` (the expert's step's
log-prob minus the refusal's). With ``rejected: fork`` the whole-turn gap compares a refusal with the write's first
tokens only; ``refusal/fork_choice_*`` (and ``refusal/contrast_fork_choice_*``) is the choice at the fork itself:
the chosen's token there against the rejected's, ``sigmoid(log p(chosen token) - log p(rejected token))`` after
their shared prefix."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from polyturn.acting.registry import spec_or_none
from polyturn.algos.preference import dpo_loss
from polyturn.config import RefusalPairsConfig, TrainConfig
from polyturn.envs.actions import ToolCall, parse_action
from polyturn.envs.spec import load_attr
from polyturn.models.actor import Actor
from polyturn.rollout.candidates import turn_context
from polyturn.rollout.context import RolloutSettings, closed_action, written_action_ids
from polyturn.rollout.generate import SampledAction
from polyturn.rollout.types import Episode
from polyturn.train.batch import MicroStats, policy_output
from polyturn.train.pairs import (CandidatePair, chosen_mask_through_rejected, chosen_through_rejected, pair_batch,
                                  pair_micro_batches, summed_logprobs)
from polyturn.train.reporting import SubProgress, ignore_steps

if TYPE_CHECKING:
    from polyturn.train.policy import Policy

#: ``EnvSpec.refusals``: ``(info["forbidden"], expert_options) -> (refusal, proceed) | None``.
RefusalHook = Callable[[Mapping[str, Any], Mapping[str, Any]], "tuple[str, str] | None"]


def check_refusals(cfg: TrainConfig, *, world_size: int = 1) -> None:
    """``ValueError`` naming the field and the fix when ``ppo.refusal_pairs`` cannot run: an env whose spec says no
    state is forbidden, or several torchrun processes."""
    if cfg.ppo.refusal_pairs is None:
        return
    spec = spec_or_none(cfg.env.id)
    if spec is None or spec.refusals is None:
        raise ValueError(f"ppo.refusal_pairs needs an env that says which states are forbidden (its EnvSpec.refusals "
                         f"hook, e.g. polyturn/CustomerService-v0), got env.id = {cfg.env.id!r}, which has none; drop "
                         "ppo.refusal_pairs, or give the env's spec a refusals hook")
    if cfg.ppo.refusal_pairs.contrast and spec.contrasts is None:
        raise ValueError(f"ppo.refusal_pairs.contrast = {cfg.ppo.refusal_pairs.contrast} needs an env that says where "
                         f"a request is allowed (its EnvSpec.contrasts hook, e.g. polyturn/CustomerService-v0), got "
                         f"env.id = {cfg.env.id!r}, which has none; set ppo.refusal_pairs.contrast=0")
    if world_size > 1:
        raise ValueError(f"Expected one process per run with ppo.refusal_pairs (its term is not sharded yet), got "
                         f"--nproc {world_size}: drop ppo.refusal_pairs with --nproc, or train in one process")


def forbidden_states(episodes: Sequence[Episode]) -> list[tuple[int, int, Mapping[str, Any]]]:
    """``(episode, turn, forbidden)`` for every turn taken at a state the env marked forbidden (the previous step's
    ``info["forbidden"]``), in episode and turn order."""
    return [(i, t, ep.turns[t - 1].info["forbidden"]) for i, ep in enumerate(episodes)
            for t in range(1, len(ep.turns)) if ep.turns[t - 1].info.get("forbidden")]


def allowed_states(episodes: Sequence[Episode]) -> list[tuple[int, int, Mapping[str, Any]]]:
    """``(episode, turn, allowed)`` for every turn taken at a state the env marked allowed (the previous step's
    ``info["allowed"]``), in episode and turn order."""
    return [(i, t, ep.turns[t - 1].info["allowed"]) for i, ep in enumerate(episodes)
            for t in range(1, len(ep.turns)) if ep.turns[t - 1].info.get("allowed")]


def contrast_pairs(episodes: Sequence[Episode], *, actor: Actor, settings: RolloutSettings, hook: RefusalHook,
                   expert_options: Mapping[str, Any], rejected_part: str = "turn") -> list[CandidatePair]:
    """One pair per turn taken at an allowed state: the expert's next step there (chosen) against a refusal
    (rejected), both as the hook writes them; ``rejected_part`` as in :func:`refusal_pairs`."""
    return written_pairs(episodes, allowed_states(episodes), actor=actor, settings=settings, hook=hook,
                         expert_options=expert_options, rejected_part=rejected_part)


def written_pairs(episodes: Sequence[Episode], states: Sequence[tuple[int, int, Mapping[str, Any]]], *, actor: Actor,
                  settings: RolloutSettings, hook: RefusalHook, expert_options: Mapping[str, Any],
                  rejected_part: str = "turn") -> list[CandidatePair]:
    """One pair per ``(episode, turn, facts)`` of ``states``, from that turn's context: the hook's two texts for the
    facts, chosen then rejected (a state the hook returns None for gives none); ``rejected_part`` as in
    :func:`refusal_pairs`."""
    pairs = []
    for i, t, facts in states:
        texts = hook(facts, expert_options)
        if texts is None:
            continue
        pair = _pair(turn_context(episodes[i], t), written(actor, settings, texts[0]),
                     written(actor, settings, texts[1]), rejected_part)
        if pair is not None:
            pairs.append(pair)
    return pairs


def _pair(context: list[int], chosen: SampledAction, rejected: SampledAction,
          rejected_part: str) -> CandidatePair | None:
    """The pair; with ``fork``, the rejected turn cut after its first token off the chosen one (None: no fork)."""
    if rejected_part == "fork":
        k = fork(chosen.ids, rejected.ids)
        if k is None:
            return None
        rejected = dataclasses.replace(rejected, ids=rejected.ids[: k + 1], logprobs=rejected.logprobs[: k + 1],
                                       hit_cap=False)
    return CandidatePair(context, chosen, rejected)


def _tool(text: str) -> str | None:
    call = parse_action(text)
    return call.tool if isinstance(call, ToolCall) else None


def written(actor: Actor, settings: RolloutSettings, text: str) -> SampledAction:
    """An action written as text, as a candidate turn: its ids as BC reads them (behaviour log-probs 0, unused)."""
    ids = written_action_ids(actor, settings, text)
    return SampledAction(ids=ids, logprobs=[0.0] * len(ids), hit_cap=False, forced=False)


def fork(chosen: Sequence[int], rejected: Sequence[int]) -> int | None:
    """The position of ``rejected``'s first token that differs from ``chosen``'s (None: it is all a prefix of it)."""
    for k, tok in enumerate(rejected):
        if k >= len(chosen) or chosen[k] != tok:
            return k
    return None


def refusal_pairs(episodes: Sequence[Episode], *, actor: Actor, settings: RolloutSettings, hook: RefusalHook,
                  expert_options: Mapping[str, Any],
                  rejected_part: str = "turn") -> tuple[list[CandidatePair], list[str]]:
    """One pair per turn taken at a forbidden state (see the module docstring), and per pair its kind, by its rejected
    step: ``sampled`` (the write the policy sampled), ``decision`` (the hook's step at the turn where the request is
    decided: it calls the refusal's own tool, before CustomerService's yes the question for one) or ``write`` (the
    hook's write). ``rejected_part`` ``fork``: the rejected turn cut after its first token that leaves the
    refusal (a step that is a prefix of the refusal gives no pair)."""
    pairs, kinds = [], []
    for i, t, forbidden in forbidden_states(episodes):
        texts = hook(forbidden, expert_options)
        if texts is None:
            continue
        refusal, proceed = texts
        turn = episodes[i].turns[t]
        tool = _tool(proceed)
        # The policy itself tried to carry the request out here: a write, the tool the hook's step calls. A step
        # that calls the refusal's own tool (a reply asking for a yes) is always the hook's: any reply the policy
        # sampled would match it, the right questions as well as the wrong ones.
        decision = tool == _tool(refusal)
        took = tool is not None and not decision and _tool(turn.action) == tool
        rejected = (SampledAction(ids=list(turn.action_ids), logprobs=list(turn.logprobs), hit_cap=turn.hit_cap,
                                  forced=turn.forced) if took else written(actor, settings, proceed))
        pair = _pair(turn_context(episodes[i], t), written(actor, settings, refusal), rejected, rejected_part)
        if pair is None:
            continue
        pairs.append(pair)
        kinds.append("sampled" if took else "decision" if decision else "write")
    return pairs, kinds


def forbidden_starts(demos: Sequence[Mapping[str, Any]], env: Any, *, actor: Actor,
                     settings: RolloutSettings) -> list[dict[str, Any]]:
    """Tasks that start at a forbidden state of a demonstration (``ppo.refusal_pairs.demo_starts``): each record is
    replayed in ``env`` from its seed, and the first step whose ``info`` marks the next state forbidden ends the
    prefix (its actions' ids, closed as BC reads them), which the collector plays as forced turns before the policy
    samples. A record whose replay stops matching its observations, or that meets no such state, gives none."""
    starts = []
    for rec in demos:
        turns = rec.get("turns") or []
        if not turns or rec.get("seed") is None:
            continue
        obs, _ = env.reset(seed=int(rec["seed"]))
        for t, turn in enumerate(turns):
            if obs != turn["observation"]:  # not the task the demonstration played
                break
            obs, _, terminated, truncated, info = env.step(turn["action"])
            if terminated or truncated:
                break
            if info.get("forbidden"):
                prefix = [closed_action(actor, actor.encode(x["action"]), settings) for x in turns[: t + 1]]
                starts.append({"seed": int(rec["seed"]), "options": {}, "prefix": prefix, "refusal_start": True})
                break
    return starts


class DemoStarts:
    """``ppo.refusal_pairs.demo_starts``: the last groups of each iteration's tasks start at forbidden states of the
    demonstrations (:func:`forbidden_starts`, ``starts``), drawn at random; refused, with the fix, where it cannot
    run (a multi-role env, or no demonstration that reaches a forbidden state)."""

    def __init__(self, cfg: TrainConfig, demos: Sequence[Mapping[str, Any]], env: Any, *, actor: Actor,
                 settings: RolloutSettings, multi: bool) -> None:
        self.n = cfg.ppo.refusal_pairs.demo_starts if cfg.ppo.refusal_pairs is not None else 0
        if self.n and multi:
            raise ValueError(f"ppo.refusal_pairs.demo_starts = {self.n} replays single-agent demonstrations, got "
                             f"the multi-role env {cfg.env.id!r}: set ppo.refusal_pairs.demo_starts=0")
        self.starts = forbidden_starts(demos, env, actor=actor, settings=settings) if self.n else []
        if self.n and not self.starts:
            raise ValueError(f"ppo.refusal_pairs.demo_starts = {self.n} needs demonstrations that reach a forbidden "
                             f"state, got none among the {len(demos)}: oversample the forbidden requests "
                             "(bc.group_shares), or set ppo.refusal_pairs.demo_starts=0")

    def apply(self, tasks: list[dict], *, group: int, rng: random.Random) -> list[dict]:
        """``tasks`` with their last (at most ``n``) groups of ``group`` replaced by drawn starts."""
        if not self.starts:
            return tasks
        k = min(self.n, len(tasks) // group)
        drawn = [rng.choice(self.starts) for _ in range(k)]
        return tasks[: len(tasks) - k * group] + [dict(start) for start in drawn for _ in range(group)]


def start_metrics(tasks: Sequence[Mapping[str, Any]], episodes: Sequence[Episode]) -> dict[str, float]:
    """``refusal/demo_starts`` (the iteration's episodes started at a demonstration's forbidden state) and
    ``refusal/start_success`` (the share of them the policy then solved: refused, as the policy says); empty when
    there were none."""
    started = [ep for task, ep in zip(tasks, episodes, strict=True) if task.get("refusal_start")]
    if not started:
        return {}
    return {"refusal/demo_starts": float(len(started)),
            "refusal/start_success": sum(ep.success for ep in started) / len(started)}


class RefusalTerm:
    """One update's refusal pairs, their frozen-reference log-probs, and the term they add to each minibatch.

    Build it with :meth:`build`; the update's minibatch loop calls it with each minibatch's statistics
    (``Policy.update_actor(beside=...)``), and :meth:`after` measures the pairs once the update is done.
    """

    def __init__(self, cfg: RefusalPairsConfig, policy: Policy, pairs: list[CandidatePair], *,
                 temperature: float, contrasts: int = 0, progress: SubProgress = ignore_steps) -> None:
        if policy.ref_actor is None:
            raise RuntimeError("ppo.refusal_pairs reads the frozen reference policy, but the policy holds none "
                               "(Policy.set_reference runs when RL starts)")
        self.cfg, self.policy, self.pairs, self.temperature = cfg, policy, pairs, temperature
        self.n_refusals = len(pairs) - contrasts  #: the refusal pairs come first, then the contrast pairs
        budget = policy.cfg.actor.microbatch_tokens
        #: ``actor.shared_prefix``: each pair's two rows run their shared context once (one pair a micro-batch).
        self.share = policy.cfg.actor.shared_prefix
        #: With ``rejected: fork`` a third column: the chosen turn through the fork token, which differs from the
        #: rejected turn in that token only, so the two sums' difference is the choice made at the fork.
        self.at_fork = cfg.rejected == "fork"
        #: ``progress`` (the reporter's ``sub``) counts the pairs through the reference and the policy, before the
        #: update's steps and again after them.
        self.progress = progress
        advance = self.progress("refusal pairs", 2 * len(pairs))
        self.ref = summed_logprobs(policy.ref_actor, pairs, temperature=temperature, budget=budget,
                                   chosen_prefix=self.at_fork, share_context=self.share, progress=advance)
        self.before = summed_logprobs(policy.actor, pairs, temperature=temperature, budget=budget,
                                      chosen_prefix=self.at_fork, share_context=self.share, progress=advance)

    @classmethod
    def build(cls, policy: Policy, episodes: Sequence[Episode], *, temperature: float,
              metrics: dict[str, float], progress: SubProgress = ignore_steps) -> RefusalTerm | None:
        """The iteration's pairs (at most ``max_pairs``: those of the kind ``first`` names first, the rest drawn at
        random), their counts into ``metrics`` (``refusal/states``: the forbidden states that gave a pair, before
        the cap); None when there are none. ``progress``: the reporter's ``sub``, for the pairs' passes."""
        cfg = policy.cfg.ppo.refusal_pairs
        assert cfg is not None
        spec = spec_or_none(policy.cfg.env.id)
        if spec is None or spec.refusals is None:  # check_refusals refused the run before it started
            return None
        pairs, kinds = refusal_pairs(episodes, actor=policy.actor, settings=policy.settings,
                                     hook=load_attr(spec.refusals), expert_options=policy.cfg.bc.expert_options,
                                     rejected_part=cfg.rejected)
        metrics["refusal/states"] = float(len(pairs))
        if len(pairs) > cfg.max_pairs:
            first = [k for k, kind in enumerate(kinds) if kind == cfg.first]
            others = [k for k, kind in enumerate(kinds) if kind != cfg.first]
            keep = (policy.py_rng.sample(first, cfg.max_pairs) if len(first) >= cfg.max_pairs else
                    first + policy.py_rng.sample(others, cfg.max_pairs - len(first)))
            pairs, kinds = [pairs[k] for k in keep], [kinds[k] for k in keep]
        metrics["refusal/pairs"] = float(len(pairs))
        metrics["refusal/sampled_writes"] = float(kinds.count("sampled"))
        metrics["refusal/decisions"] = float(kinds.count("decision"))
        contrast: list[CandidatePair] = []
        if cfg.contrast and spec.contrasts is not None:
            contrast = contrast_pairs(episodes, actor=policy.actor, settings=policy.settings,
                                      hook=load_attr(spec.contrasts), expert_options=policy.cfg.bc.expert_options,
                                      rejected_part=cfg.rejected)
            metrics["refusal/contrast_states"] = float(len(contrast))
            if len(contrast) > cfg.contrast:
                contrast = [contrast[k] for k in sorted(policy.py_rng.sample(range(len(contrast)), cfg.contrast))]
            metrics["refusal/contrast_pairs"] = float(len(contrast))
        pairs = pairs + contrast
        return (cls(cfg, policy, pairs, temperature=temperature, contrasts=len(contrast), progress=progress)
                if pairs else None)

    def __call__(self, acc: MicroStats) -> Iterator[torch.Tensor]:
        """One minibatch's term over up to ``ppo.minibatch_episodes`` pairs drawn at random: ``weight`` x (DPO +
        ``nll`` x NLL of the refusals) as micro-batch losses (DPO weighted by each micro-batch's share of the pairs,
        the NLL by its share of the refusals' tokens); the statistics go into ``acc``."""
        policy, cfg = self.policy, self.cfg
        drawn = policy.py_rng.sample(range(len(self.pairs)), min(policy.cfg.ppo.minibatch_episodes, len(self.pairs)))
        pairs = [self.pairs[k] for k in drawn]
        # The NLL's tokens: each chosen turn whole, or through the fork token (nll_through: fork).
        through = cfg.nll_through == "fork"
        n_tok = sum(len(pr.rejected.ids) if through else len(pr.chosen.ids) for pr in pairs)
        for micro in pair_micro_batches(pairs, policy.cfg.actor.microbatch_tokens, share_context=self.share):
            batch = pair_batch(pairs, micro, policy.actor, share_context=self.share)
            acc.count([[len(pairs[i].context) + len(a.ids)] for i in micro
                       for a in (pairs[i].chosen, pairs[i].rejected)])
            po = policy_output(policy.actor, batch, temperature=self.temperature)
            tok = po.logprobs * batch.action_mask
            lp = tok.sum(1).view(len(micro), 2)
            ref = self.ref[[drawn[i] for i in micro]].to(lp.device, lp.dtype)
            if self.at_fork:  # the decision at the fork: the chosen turn through its fork token, as the rejected ends
                lp_chosen, ref_chosen = chosen_through_rejected(tok, batch, [pairs[i] for i in micro]), ref[:, 2]
            else:
                lp_chosen, ref_chosen = lp[:, 0], ref[:, 0]
            out = dpo_loss(lp_chosen, lp[:, 1], ref_chosen, ref[:, 1], beta=cfg.beta)
            chosen = (chosen_mask_through_rejected(batch, [pairs[i] for i in micro]) if through
                      else batch.action_mask[0::2])
            nll = -(po.logprobs[0::2] * chosen).sum() / chosen.sum().clamp_min(1.0)
            pair_share, tok_share = len(micro) / len(pairs), float(chosen.sum()) / max(1, n_tok)
            acc.add({"refusal/dpo_loss": out["loss"], "refusal/accuracy": out["accuracy"],
                     "refusal/margin": out["reward_margin"]}, pair_share)
            acc.add({"refusal/nll": nll}, tok_share)
            yield cfg.weight * (pair_share * out["loss"] + cfg.nll * tok_share * nll)

    def after(self) -> dict[str, float]:
        """The refusals' summed log-prob, its gap to the writes' and their probability against the writes, before and
        after the update."""
        after = summed_logprobs(self.policy.actor, self.pairs, temperature=self.temperature,
                                budget=self.policy.cfg.actor.microbatch_tokens, chosen_prefix=self.at_fork,
                                share_context=self.share, progress=self.progress("refusal pairs after",
                                                                                 len(self.pairs)))
        out, n = {}, self.n_refusals
        for when, lp in (("before", self.before), ("after", after)):
            if n:
                ref = lp[:n]
                out[f"refusal/logp_{when}"] = float(ref[:, 0].mean())
                out[f"refusal/gap_{when}"] = float((ref[:, 0] - ref[:, 1]).mean())
                out[f"refusal/choice_{when}"] = float(torch.sigmoid(ref[:, 0] - ref[:, 1]).mean())
            if len(lp) > n:  # the contrast pairs: the expert's step against the refusal
                out[f"refusal/contrast_gap_{when}"] = float((lp[n:, 0] - lp[n:, 1]).mean())
            if self.at_fork:  # at the fork: the chosen's token against the rejected's, after their shared prefix
                choice = torch.sigmoid(lp[:, 2] - lp[:, 1])
                if n:
                    out[f"refusal/fork_choice_{when}"] = float(choice[:n].mean())
                if len(lp) > n:
                    out[f"refusal/contrast_fork_choice_{when}"] = float(choice[n:].mean())
        return out
