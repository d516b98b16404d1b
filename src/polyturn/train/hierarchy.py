"""Hierarchical agents in training: both policies seated in every game, and the credit each learns from.

A run with ``hierarchy:`` set plays :class:`~polyturn.envs.hierarchy.HierarchicalEnv` games (the env wrapped by
:func:`polyturn.acting.hierarchy.make_hierarchical`) through the several-policies machinery of self-play: the
multi-role collector, one :class:`~polyturn.train.policy.Policy` per role (``manager``, ``worker``; each its own
actor, critic and optimizer, each BC'd on its own demonstrations), role-masked losses by construction (an episode
holds one role's tokens).

Credit:

* **the worker** learns from its turns' rewards: the env's, plus the intrinsic reward for reaching its subgoal
  (the env's check of it; for a subgoal the env cannot check, ``hierarchy.judge``'s verdict on the turns it spent
  on it, paid on its ``subgoal_done`` turn: :class:`SubgoalJudge`);
* **the manager** learns over subgoal-level steps, a semi-MDP: its turn ``j``'s reward is the worker's env
  rewards under that subgoal discounted inside it, ``R_j = sum_i gamma^i r_{t_j + i}``
  (:func:`polyturn.algos.gae.semi_mdp_rewards`), and ``info["duration"] = d_j`` makes GAE discount the next
  manager state by ``gamma^{d_j}`` (:func:`polyturn.train.critics.base.turn_discounts`). Its critic is its own
  policy's, at the manager level; with ``critic.privileged`` it reads the privileged text.
* the manager updates every ``hierarchy.manager_every`` iterations (null: never, held at BC), the worker every
  iteration.

Held-out evaluation plays both policies on every task; the worker's episodes are the results (a task is solved
when the game is), with the subgoals it was given in its observations and ``subgoal_index`` in its turns' info.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from polyturn.acting.hierarchy import play_hierarchy
from polyturn.algos.gae import semi_mdp_rewards
from polyturn.acting.judge import YES_NO_ANSWER, JudgeCache, chat_completion, check_endpoint, judge_records
from polyturn.config import JudgeConfig, TrainConfig
from polyturn.envs.hierarchy import DONE_TOOL, INTRINSIC, MANAGER, UNREACHED, WORKER, subgoal_durations
from polyturn.rollout.multi import MultiAgentCollector, Seat
from polyturn.rollout.types import Episode
from polyturn.train.policy import Policy


def semi_mdp(manager: Episode, worker: Episode, gamma: float) -> None:
    """Give ``manager``'s turns their semi-MDP rewards and durations (in place), from ``worker``'s turns of the same
    game: a valid turn's reward is the discounted sum of the env rewards of the worker turns under its subgoal
    (the intrinsic reward and the unreached penalty left out: the worker's alone), its ``info["duration"]`` their
    count; a turn that set nothing gets 0 and 0."""
    durations = subgoal_durations([t.info for t in manager.turns], [t.info for t in worker.turns])
    by_goal: dict[int, list[float]] = {}
    for t in worker.turns:
        own = t.reward_terms.get(INTRINSIC, 0.0) + t.reward_terms.get(UNREACHED, 0.0)
        by_goal.setdefault(int(t.info["subgoal_index"]), []).append(t.reward - own)
    for turn, d in zip(manager.turns, durations, strict=True):
        turn.info["duration"] = d
        if d == 0:
            turn.reward = 0.0
            continue
        steps = by_goal[int(turn.info["subgoal_index"])]
        rewards, _ = semi_mdp_rewards(torch.tensor(steps, dtype=torch.float64), [d], gamma)
        turn.reward = float(rewards[0])


#: The subgoal judge's prompt: the env's rubric, the task with the subgoal, the worker's turns on it.
_SUBGOAL_ASKED = (
    "You judge whether an agent ({task}) reached one subgoal of its task, set by its manager.\n\n"
    "Task and subgoal:\n{question}\n\nThe agent's turns on the subgoal (AGENT: its action; ENV: the answer):\n"
    "{transcript}\n\nDid the agent reach the subgoal? ")
SUBGOAL_TEMPLATE = _SUBGOAL_ASKED + ("Give a short reason, then a last line 'Score: N' with N from 1 (clearly not "
                                     "reached) to 10 (clearly reached).")
#: The same question for ``hierarchy.judge.scoring: yes_no``: one word, P(Yes) against P(No).
SUBGOAL_YES_NO_TEMPLATE = _SUBGOAL_ASKED + YES_NO_ANSWER
#: The verdict cache's file in the run directory when ``hierarchy.judge.cache`` is null.
SUBGOAL_CACHE_FILE = "subgoal_judge_cache.jsonl"


def unchecked_segments(worker: Episode) -> list[tuple[int, dict]]:
    """The worker's subgoals the env could not check that it declared done: (the index of the ``subgoal_done``
    turn, a record of its turns on that subgoal for the judge: the task and the subgoal as its question)."""
    out = []
    start = 0
    for i, t in enumerate(worker.turns):
        if i > 0 and t.info.get("subgoal_index") != worker.turns[i - 1].info.get("subgoal_index"):
            start = i
        if t.info.get("action_type") == DONE_TOOL and not t.info.get("subgoal_checked", True):
            seg = worker.turns[start:i]
            rec = {"env_id": worker.env_id, "task_id": worker.task_id, "seed": worker.seed,
                   "question": f"{worker.question}\nSubgoal: {t.info.get('subgoal_text', '')}",
                   "turns": [{"observation": x.observation, "action": x.action} for x in seg],
                   "final_observation": t.observation}
            out.append((i, rec))
    return out


class SubgoalJudge:
    """``hierarchy.judge``: the LLM judge of the subgoals the env cannot check (:mod:`polyturn.acting.judge`: an
    OpenAI-compatible endpoint, retries, the verdict cache, a concurrency limit). A score ``>= threshold`` pays the
    worker's intrinsic reward on its ``subgoal_done`` turn."""

    def __init__(self, cfg: JudgeConfig, *, out_dir: Path, intrinsic: float) -> None:
        self.cfg, self.intrinsic = cfg, intrinsic
        check_endpoint(base_url=cfg.endpoint, timeout=min(cfg.timeout, 10.0))  # now, not after BC
        self.cache = JudgeCache(cfg.cache or out_dir / SUBGOAL_CACHE_FILE)
        self.ask = chat_completion(cfg.model, base_url=cfg.endpoint, timeout=cfg.timeout, max_retries=cfg.retries,
                                   scoring=cfg.scoring)
        self.template = SUBGOAL_YES_NO_TEMPLATE if cfg.scoring == "yes_no" else SUBGOAL_TEMPLATE

    def apply(self, workers: Sequence[Episode]) -> dict[str, float]:
        """Judge every unchecked subgoal the ``workers`` declared done; pay the reached ones; the metrics."""
        todo = [(ep, i, rec) for ep in workers for i, rec in unchecked_segments(ep)]
        if not todo:
            return {}
        verdicts = judge_records([rec for _, _, rec in todo], self.ask, model=self.cfg.model, cache=self.cache,
                                 names=[f"subgoal {rec['question'].rsplit('Subgoal: ', 1)[-1]!r} of task "
                                        f"{ep.task_id!r}" for ep, _, rec in todo],
                                 concurrency=self.cfg.concurrency, template=self.template, final=True,
                                 scoring=self.cfg.scoring,
                                 on_malformed="record" if self.cfg.on_malformed == "skip" else "stop")
        reached = 0
        for (ep, i, _), v in zip(todo, verdicts):
            if v.value is not None and v.value >= self.cfg.threshold:
                turn = ep.turns[i]
                turn.reward += self.intrinsic
                turn.reward_terms[INTRINSIC] = turn.reward_terms.get(INTRINSIC, 0.0) + self.intrinsic
                reached += 1
        return {"hierarchy/judged": float(len(todo)), "hierarchy/judged_reached": reached / len(todo),
                "hierarchy/judge_malformed": float(sum(v.value is None for v in verdicts))}


class HierarchyPlay:
    """The games of each iteration (both roles the learning policies) and each policy's batch, for the trainer's
    multi-role path (the interface of :class:`polyturn.train.selfplay.SelfPlay`)."""

    def __init__(self, cfg: TrainConfig, *, policies: dict[str, Policy], out: Path) -> None:
        if set(policies) != {MANAGER, WORKER}:
            raise ValueError(f"Expected a manager and a worker policy, got {sorted(policies)}")
        self.cfg, self.policies = cfg, policies
        h = cfg.hierarchy
        self.judge = SubgoalJudge(h.judge, out_dir=out, intrinsic=h.intrinsic) if h and h.judge else None
        self.roles = (MANAGER, WORKER)
        c = cfg.curriculum
        self.rl_total = c.warmup_iters + c.mixed_iters + c.ppo_iters
        self._it = 0

    def _seats(self) -> dict[str, Seat]:
        return {r: Seat(r, actor=self.policies[r].actor) for r in self.roles}

    def games(self, tasks: Sequence[dict], it: int, *, group: int) -> tuple[list[dict], dict[str, float]]:
        """Every task a game with the learning manager and worker (``group``: unused, every seat is the same)."""
        self._it = it
        return [{**t, "seats": self._seats()} for t in tasks], {}

    def batches(self, played: Sequence[dict[str, Episode]]) -> tuple[dict[str, list[Episode]], dict[str, float]]:
        """Each policy's training episodes, the manager's with semi-MDP credit (none on an iteration it does not
        update), and the hierarchy's metrics: subgoals set per game, subgoals reached per game (those that paid the
        intrinsic reward: checked ones, once a name), subgoals left unreached per game (those charged
        ``hierarchy.unreached``; 0 when it is 0), worker turns per subgoal set, env steps in the batch (worker
        turns other than ``subgoal_done``), and per subgoal name the share of games in which the manager set it
        (``hierarchy/set_share/<name>``)."""
        gamma = self.cfg.curriculum.gamma.at(self._it / max(1, self.rl_total))
        judged = self.judge.apply([eps[WORKER] for eps in played]) if self.judge is not None else {}
        out: dict[str, list[Episode]] = {MANAGER: [], WORKER: []}
        set_n = reached = unreached = turns = steps = 0.0
        by_name: dict[str, float] = {}  # games in which the manager set each subgoal (what it stops setting shows)
        for eps in played:
            manager, worker = eps[MANAGER], eps[WORKER]
            semi_mdp(manager, worker, gamma)
            for role, ep in ((MANAGER, manager), (WORKER, worker)):
                if ep.turns:
                    out[role].append(ep)
            set_n += sum("subgoal_index" in t.info for t in manager.turns)
            for name in {t.info["subgoal"] for t in manager.turns if "subgoal" in t.info}:
                by_name[name] = by_name.get(name, 0.0) + 1.0
            reached += sum(t.reward_terms.get(INTRINSIC, 0.0) > 0 for t in worker.turns)
            unreached += sum(t.reward_terms.get(UNREACHED, 0.0) < 0 for t in worker.turns)
            turns += len(worker.turns)
            steps += sum(t.info.get("action_type") != DONE_TOOL for t in worker.turns)
        n = max(1, len(played))
        metrics = {"hierarchy/subgoals_set": set_n / n, "hierarchy/subgoals_reached": reached / n,
                   "hierarchy/subgoals_unreached": unreached / n,
                   "hierarchy/worker_turns_per_subgoal": turns / max(1.0, set_n),
                   "hierarchy/env_steps": steps,  # the worker's turns that stepped the env, in the batch
                   "hierarchy/manager_updates": float(self.manager_learns()),
                   **{f"hierarchy/set_share/{k}": v / n for k, v in sorted(by_name.items())}}
        if not self.manager_learns():
            out[MANAGER] = []
        return out, {**metrics, **judged}

    def manager_learns(self) -> bool:
        """Whether this iteration updates the manager (every ``hierarchy.manager_every``-th; null: never)."""
        every = self.cfg.hierarchy.manager_every
        return every is not None and self._it % every == 0

    def held_out(self, collector: MultiAgentCollector, tasks: Sequence[dict], *, temperature: float, label: str,
                 progress: Callable[[int], None] | None = None) -> list[Episode]:
        """The worker's episodes of held-out ``tasks``, both learning policies playing (sampling seeded by the run
        seed, as single-agent evaluation seeds it)."""
        actor = self.policies[WORKER].actor
        generator = torch.Generator(device=actor.device).manual_seed(self.cfg.run.seed)
        return play_hierarchy(collector, tasks, {r: self.policies[r].actor for r in self.roles},
                              temperature=temperature, label=label, generator=generator, progress=progress)

    def snapshot(self, it: int, actors: dict) -> None:
        """No opponent pool: nothing to keep."""
