"""Serving fixtures: tiny checkpoints trained for a second to answer with one fixed action, and a real server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

ACTION = "Thought: inspect the schema first.\nAction: list_tables[{}]"
TASKS = ["Which 3 products had the highest revenue in East China in 2024-Q3?", "hello", "product | v\nRice | 99887",
         "Action: describe_table", "华东"]
ADMIN_TOKEN = "test-admin-token-0123456789"


def make_checkpoint(
    root: Path, tokenizer, *, name: str, seed: int, steps: int = 60, max_action_tokens: int = 24,
    action: str = ACTION, tasks: Sequence[str] = TASKS, context_budget: int = 512, hidden: int = 32, heads: int = 4,
) -> Path:
    """A checkpoint directory (actor/ + config.yaml) whose actor answers ``action`` (default ``ACTION``) to any task
    like ``tasks`` (default: short ones). ``hidden`` / ``heads``: the tiny model's width and attention heads."""
    from polyturn.models.actor import tiny_actor

    actor = tiny_actor(tokenizer, hidden=hidden, layers=2, heads=heads, seed=seed)
    opt = torch.optim.Adam(actor.model.parameters(), lr=2e-2)
    act = actor.encode(action) + [actor.stop_id]
    obs = actor.encode(actor.chat.render_observation("Tables: sales"))
    seqs, masks = [], []
    for task in tasks:
        prefix = actor.encode(actor.chat.render_prefix(task, None))
        seq = prefix + act + obs + act
        mask = [0] * len(prefix) + [1] * len(act) + [0] * len(obs) + [1] * len(act)
        seqs.append(seq)
        masks.append(mask)
    return fit_and_save(actor, opt, seqs, masks, steps=steps, ckpt=root / name,
                        overrides=[f"rollout.max_action_tokens={max_action_tokens}",
                                   f"rollout.context_budget={context_budget}"])


def fit_and_save(actor, opt: torch.optim.Optimizer, seqs: Sequence[list[int]], masks: Sequence[list[int]], *,
                 steps: int, ckpt: Path, overrides: Sequence[str], weights: Sequence[float] | None = None,
                 until_p: float | None = None) -> Path:
    """``steps`` full-batch steps of NLL on the tokens ``masks`` marks in ``seqs`` (each sequence weighted by
    ``weights``), then ``actor`` saved as the checkpoint ``ckpt`` (actor/ + a config of ``overrides``). With
    ``until_p``, fewer steps once every marked token has a probability of at least ``until_p`` (> 0.5: greedy
    decoding then writes the marked tokens on those contexts)."""
    from polyturn.config import load_config, save_config

    model = actor.model.train()
    n = max(len(s) for s in seqs)
    ids = torch.tensor([s + [actor.pad_id] * (n - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in seqs])
    m = torch.tensor([mk + [0] * (n - len(mk)) for mk in masks], dtype=torch.float)[:, 1:]
    w = torch.tensor(weights if weights is not None else [1.0] * len(seqs))[:, None]
    for _ in range(steps):
        lp = model(input_ids=ids, attention_mask=attn).logits[:, :-1].log_softmax(-1)
        lp = lp.gather(-1, ids[:, 1:, None]).squeeze(-1)
        if until_p is not None and bool((lp.detach().exp() >= until_p)[m > 0].all()):
            break
        loss = -(w * lp * m).sum() / (w * m).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    actor.save_pretrained(ckpt / "actor")
    save_config(load_config(None, list(overrides)), ckpt / "config.yaml")
    return ckpt


def fixed_reply_checkpoint(root: Path, tokenizer, *, name: str, reply: str, steps: int = 40) -> Path:
    """A checkpoint whose actor replies ``reply`` to any prompt, however long (a judge that always gives one score).

    Its attention output projections are zero and stay so: each position sees only its own token, so the reply
    follows from the prompt's last token (the chat template's, the same in every prompt) as a chain of bigrams,
    learnt in a second on one short prompt."""
    from polyturn.models.actor import tiny_actor

    actor = tiny_actor(tokenizer, hidden=32, layers=2, heads=4, seed=0)
    model = actor.model
    for layer in model.model.layers:
        torch.nn.init.zeros_(layer.self_attn.o_proj.weight)
        layer.self_attn.o_proj.weight.requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    prefix = actor.encode(actor.chat.render_prefix("hello", None))
    act = actor.encode(reply) + [actor.stop_id]
    return fit_and_save(actor, opt, [prefix + act], [[0] * len(prefix) + [1] * len(act)], steps=steps,
                        ckpt=root / name, overrides=["rollout.max_action_tokens=16", "rollout.context_budget=8192"])


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory, tiny_tokenizer) -> list[Path]:
    """Two versions, ``v1`` and ``v2`` (different seeds, same fixed answer)."""
    root = tmp_path_factory.mktemp("ckpts")
    return [make_checkpoint(root, tiny_tokenizer, name="v1", seed=0),
            make_checkpoint(root, tiny_tokenizer, name="v2", seed=1)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    """A real uvicorn server in a thread, on a free loopback port."""

    def __init__(self, app) -> None:
        import uvicorn

        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> RunningServer:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """The server's data directory holding one generated sales database (and a text file that is not one)."""
    from polyturn.envs.sql.database import write_sales_db

    d = tmp_path_factory.mktemp("data")
    write_sales_db(d / "shop.db", 0)
    (d / "notes.txt").write_text("Not a database: a note a user might name by mistake.\n" * 200)
    return d


def record_sessions(root: Path, tokenizer) -> tuple[list[Path], list[dict]]:
    """Two checkpoints ``v1``, ``v2`` under ``root``, and the records of sessions ``v1`` served at temperature 1 by a
    real server: six SQL environment sessions of up to 3 turns (``v1``'s context budget makes the third a rebuilt
    context) and a chat session whose completions extend one conversation (7 episodes)."""
    import httpx

    from polyturn.acting.jsonl import read_jsonl
    from polyturn.envs.sql.database import write_sales_db
    from polyturn.serve.app import create_app
    from polyturn.serve.service import ServeConfig

    from polyturn.config import load_config, save_config

    ckpts = [make_checkpoint(root, tokenizer, name=f"v{k + 1}", seed=k, steps=30) for k in range(2)]
    # A context budget the third turn of an environment session overflows: the context policy rebuilds it there.
    save_config(load_config(None, ["rollout.max_action_tokens=24", "rollout.context_budget=200"]),
                ckpts[0] / "config.yaml")
    data = root / "data"
    data.mkdir()
    write_sales_db(data / "shop.db", 0)
    rec = root / "rec"
    cfg = ServeConfig(checkpoints=[str(c) for c in ckpts], record_dir=str(rec), data_dir=str(data), max_sessions=8)
    with RunningServer(create_app(cfg)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        for seed in range(6):
            s = c.post("/v1/sessions", json={"env": "polyturn/SQLAnalyst-v0", "seed": seed, "model": "v1",
                                             "temperature": 1.0, "database": "shop.db"}).json()
            c.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 3})
            c.delete(f"/v1/sessions/{s['id']}")
        sid = c.post("/v1/sessions", json={"model": "v1", "temperature": 1.0}).json()["id"]
        msgs = [{"role": "user", "content": "hello"}]
        msg = c.post("/v1/chat/completions", json={"model": "v1", "messages": msgs, "session_id": sid}).json()
        msgs += [msg["choices"][0]["message"], {"role": "user", "content": "Tables: sales"}]
        c.post("/v1/chat/completions", json={"model": "v1", "messages": msgs, "session_id": sid})
        c.delete(f"/v1/sessions/{sid}")
    return ckpts, list(read_jsonl(rec / "sessions.jsonl"))


#: The hand-trained hierarchical checkpoint's manager action, and its worker's two actions.
SET_INSPECT = 'Action: set_subgoal[{"name": "inspect"}]'
LIST_TABLES = "Action: list_tables[{}]"
SUBGOAL_DONE = "Action: subgoal_done[{}]"


def hierarchical_checkpoint(root: Path, tokenizer, *, name: str = "h", k: int = 2, steps: int = 150,
                            seeds: int = 8) -> Path:
    """A hierarchical checkpoint in training's layout (``actor/``: the manager, ``roles/worker/actor/``: the worker,
    a config with ``hierarchy: {k}`` on the SQL analyst, two env turns a task), its two tiny actors trained on
    scripted games of tasks ``0 .. seeds - 1`` (k 1 and 2 in turn): the manager always sets the subgoal
    ``inspect``; the worker writes ``list_tables`` first under each new subgoal (its context ends with the
    ``Subgoal: ...`` line) and ``subgoal_done`` after any other observation. On those tasks' contexts they act so,
    greedily; elsewhere they may not."""
    import shutil

    from polyturn.acting.checkpoint import rollout_settings
    from polyturn.acting.hierarchy import make_hierarchical, play_game
    from polyturn.config import load_config
    from polyturn.envs.hierarchy import MANAGER, WORKER
    from polyturn.models.actor import tiny_actor
    from polyturn.rollout.context import tokenize_demo

    overrides = ["env.id=polyturn/SQLAnalyst-v0", "env.kwargs={max_turns: 2}", "rollout.max_action_tokens=32",
                 "rollout.context_budget=2048"]
    players = {MANAGER: lambda view: SET_INSPECT,
               WORKER: lambda view: LIST_TABLES if view["history"][-1]["turns"] == 0 else SUBGOAL_DONE}
    games = []
    for seed in range(seeds):
        cfg = load_config(None, [*overrides, f"hierarchy={{k: {1 + seed % 2}}}"])
        env = make_hierarchical(cfg.env.id, cfg.env.kwargs, cfg.hierarchy)
        games.append(play_game(env, players, seed=seed, env_id=cfg.env.id))
        env.close()
    overrides.append(f"hierarchy={{k: {k}}}")
    settings = rollout_settings(load_config(None, overrides))
    ckpt = root / name
    for role, seed in ((MANAGER, 0), (WORKER, 1)):
        actor = tiny_actor(tokenizer, hidden=48, layers=2, heads=4, seed=seed)
        segs = [seg for g in games for seg in tokenize_demo(actor, settings, g[role]).segments]
        opt = torch.optim.Adam(actor.model.parameters(), lr=2e-2)
        out = root / f"{name}-{role}"
        fit_and_save(actor, opt, [s.ids for s in segs], [s.action_mask for s in segs], steps=steps, ckpt=out,
                     overrides=overrides, until_p=0.9)
        dest = ckpt / ("actor" if role == MANAGER else "roles/worker/actor")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(out / "actor"), dest)
        if role == MANAGER:
            shutil.move(str(out / "config.yaml"), ckpt / "config.yaml")
        shutil.rmtree(out)
    return ckpt
