"""Checkpoints: standard Hugging Face directories plus everything needed to resume.

Layout of ``<run>/<name>/``::

    actor/            save_pretrained (full model, or a peft adapter for LoRA) + tokenizer
    ref_actor/        the frozen reference, i.e. the BC policy, in the same form (ppo.kl_coef > 0, or
                      turn_dpo with ppo.dpo_reference bc)
    critic/           separate critic: critic_config.json, encoder/ (a BERT dir), tokenizer/, heads.safetensors
    critic_rng.pt     the separate critic's minibatch sampling RNG
    critic_target/    its Polyak-averaged target network (critic.target: td only)
    replay.pt         the critic's replay buffer (critic.target: td only)
    value_head.safetensors   shared critic's head (kind: shared)
    roles/<role>/     self-play with a policy per role: each other role's actor/, ref_actor/ and critic parts
    costs/<term>/     constrained RL: each cost critic's part, as the critic's above (``cost_violation`` for
                      ``cost/violation``); its multipliers are in trainer_state.json
    config.yaml       the resolved config
    trainer_state.json  phase position, task counter, evaluations
    optim.pt          optimizer states
    rng.pt            numpy / torch / python RNG states

The critic learner writes and reads its own part (``CriticLearner.save`` / ``load``).

``<run>/latest`` names the newest complete checkpoint; a checkpoint is written
to a temporary directory and renamed, so a run killed while saving never
leaves a half-written one behind ``latest``.
"""

from __future__ import annotations

import json
import pickle
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from polyturn.config import TrainConfig, save_config
from polyturn.models.actor import Actor
from polyturn.train import distributed


def _rng_states(rngs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"torch_global": torch.get_rng_state(), "py_global": random.getstate()}
    for k, r in rngs.items():
        if isinstance(r, np.random.Generator):
            out[k] = r.bit_generator.state
        elif isinstance(r, torch.Generator):
            out[k] = r.get_state()
        else:
            out[k] = r.getstate()
    return out


def save(
    directory: Path,
    *,
    actor: Actor,
    critic: Any,
    cfg: TrainConfig,
    state: dict[str, Any],
    optimizers: dict[str, torch.optim.Optimizer],
    rngs: dict[str, Any],
    run_dir: Path,
    ref_actor: Actor | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write a checkpoint atomically and update ``run_dir/latest``; ``extra`` writes more parts into it first."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    actor.save_pretrained(tmp / "actor")
    if ref_actor is not None:
        ref_actor.save_pretrained(tmp / "ref_actor")
    critic.save(tmp)
    if extra is not None:
        extra(tmp)
    save_config(cfg, tmp / "config.yaml")
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
    torch.save({k: o.state_dict() for k, o in optimizers.items()}, tmp / "optim.pt")
    with (tmp / "rng.pt").open("wb") as f:
        pickle.dump(_rng_states(rngs), f)
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    (run_dir / "latest.tmp").write_text(directory.name)
    (run_dir / "latest.tmp").replace(run_dir / "latest")
    return directory


#: What a training run writes into its directory, beside checkpoints (``ckpt-*``) and rank sub-runs (``rank*``).
RUN_FILES = ("metrics.jsonl", "summary.json", "latest", "config.yaml", "demos.jsonl", "tb")


def earlier_run(run_dir: Path) -> list[str]:
    """The names in ``run_dir`` that show an earlier run: its metrics log, summary, checkpoints (sorted)."""
    if not run_dir.is_dir():
        return []
    return sorted(p.name for p in run_dir.iterdir()
                  if p.name in ("metrics.jsonl", "summary.json", "latest") or p.name.startswith("ckpt-"))


def clear_run(run_dir: Path, keep: Path | None = None) -> None:
    """Remove what an earlier run wrote into ``run_dir`` (its files, checkpoints, evaluations, rank sub-runs),
    nothing else: other files a user keeps there stay, and so does ``keep`` (e.g. demonstrations the new run reads)."""
    for p in run_dir.iterdir():
        ours = (p.name in RUN_FILES or p.name.startswith(("ckpt-", "rank", "latest.tmp"))
                or (p.name.startswith("eval_") and p.suffix == ".jsonl"))
        if not ours or (keep is not None and p.resolve() == keep.resolve()):
            continue
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def open_run(main_out: Path, *, resume: bool, overwrite: bool, keep: Path | None) -> tuple[Path, Path | None]:
    """The directory this process writes the run into, and the checkpoint it resumes from (None: a new run).

    A directory that holds an earlier run is refused unless the run resumes it or ``overwrite`` clears it first
    (``keep``, e.g. the demonstrations the new run reads, stays). Under torchrun rank 0 owns ``main_out``; the other
    ranks write under ``main_out/rank<r>``.
    """
    if resume and overwrite:
        raise ValueError("Expected --resume or --overwrite, got both: --resume continues the run in "
                         f"{main_out}, --overwrite starts it again")
    earlier = [] if resume else earlier_run(main_out)
    if earlier and not overwrite:
        raise FileExistsError(
            f"run.out_dir {main_out} already holds a run ({', '.join(earlier)}): pass --resume to continue it, "
            "--overwrite to start it again (its metrics, evaluations and checkpoints are removed first), or "
            "set another run.out_dir")
    if earlier and distributed.rank() == 0:
        clear_run(main_out, keep=keep)
    distributed.barrier()
    out = main_out / f"rank{distributed.rank()}" if distributed.rank() else main_out
    out.mkdir(parents=True, exist_ok=True)
    resume_from = latest(main_out) if resume else None
    if resume and resume_from is None:
        raise FileNotFoundError(f"--resume: no checkpoint found in {out} (expected {out}/latest)")
    return out, resume_from


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    marker = run_dir / "latest"
    if not marker.is_file():
        return None
    path = run_dir / marker.read_text().strip()
    return path if (path / "trainer_state.json").is_file() else None


def load_state(
    directory: Path, *, optimizers: dict[str, torch.optim.Optimizer], rngs: dict[str, Any]
) -> dict[str, Any]:
    """Restore optimizer and RNG states (in place) and return the trainer state."""
    opt_states = torch.load(directory / "optim.pt", map_location="cpu", weights_only=False)  # load_state_dict moves it to the params
    for k, o in optimizers.items():
        if k in opt_states:
            o.load_state_dict(opt_states[k])
    with (directory / "rng.pt").open("rb") as f:
        states = pickle.load(f)
    torch.set_rng_state(states["torch_global"])
    random.setstate(states["py_global"])
    for k, r in rngs.items():
        if isinstance(r, np.random.Generator):
            r.bit_generator.state = states[k]
        elif isinstance(r, torch.Generator):
            r.set_state(states[k])
        else:
            r.setstate(states[k])
    return json.loads((directory / "trainer_state.json").read_text())


def role_dir(directory: Path, policy: Any, *, main: bool) -> Path:
    """Where ``policy``'s parts lie in checkpoint ``directory``: at its top for the run's main policy, under
    ``roles/<name>/`` for the other roles' policies (self-play with ``selfplay.weights: per_role``)."""
    return directory if main else directory / "roles" / policy.name


def policy_optimizers(policies: list[Any]) -> dict[str, torch.optim.Optimizer]:
    """The optimizers a checkpoint keeps, by name: the main policy's actor and critic ones as ``actor`` and the
    critic's names, each other policy's prefixed with its name."""
    main, *others = policies
    out = {"actor": main.opt, **main.critic.optimizers()}
    if main.constraints is not None:
        out |= main.constraints.optimizers()
    for p in others:
        out |= {f"{p.name}/actor": p.opt, **{f"{p.name}/{k}": o for k, o in p.critic.optimizers().items()}}
    return out


def save_parts(policies: list[Any], directory: Path) -> None:
    """What a checkpoint holds beyond the main policy's actor, critic and reference: its cost critics
    (``costs/``), and each other role's policy under ``roles/<name>/`` (actor, critic, reference)."""
    main, *others = policies
    if main.constraints is not None:
        main.constraints.save(directory)
    save_roles(others, directory)


def save_roles(policies: list[Any], directory: Path) -> None:
    """Write each of ``policies`` (the other roles') under ``directory/roles/<name>/``: actor, critic, reference."""
    for p in policies:
        d = role_dir(directory, p, main=False)
        p.actor.save_pretrained(d / "actor")
        p.critic.save(d)
        if p.ref_actor is not None:
            p.ref_actor.save_pretrained(d / "ref_actor")
