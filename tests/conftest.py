"""Shared fixtures: tiny models and tokenizers built in seconds, threads pinned for speed."""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Small ops run several times faster on one thread on these 2-core machines.
torch.set_num_threads(1)

CORPUS = [
    "Thought: inspect the schema first.\nAction: list_tables[{}]",
    "Action: describe_table[{\"table\": \"sales\"}]",
    "Action: run_sql[{\"sql\": \"SELECT product, SUM(revenue) AS v FROM sales WHERE zone = 'East China' GROUP BY product ORDER BY v DESC LIMIT 3\"}]",
    "Action: submit_answer[{\"answer\": [\"Green Tea\", \"Rice\", \"Soy Sauce\"]}]",
    "Which 3 products had the highest revenue in East China in 2024-Q3? 华东",
    "product | v\nGreen Tea | 123456\nRice | 99887",
] * 20


def pytest_collection_modifyitems(config, items):
    """Test files with a slow test first, each file's tests kept together and in order (so module fixtures are
    built once): pytest-xdist then starts the slow ones early on separate workers instead of leaving one for last."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Under ``--dist loadgroup`` every test marked ``xdist_group`` must carry its group in its id (pytest-xdist adds
    it), or each worker builds the group's module fixtures again: pytest 9.2 ignores the renaming (pyproject.toml
    pins pytest below it), and the suite ran 2 minutes longer for it unnoticed."""
    if not session.config.getoption("loadgroup", default=False):
        return
    lost = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(f"--dist loadgroup: {len(lost)} tests marked xdist_group carry no group in their id "
                                f"(e.g. {lost[0]}), so their group runs on every worker; install the pytest "
                                "pyproject.toml pins (pytest < 9.2)")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from polyturn.models.chat import SIMPLE_SPECIAL_TOKENS
    from polyturn.models.tokenizer import train_tokenizer

    return train_tokenizer(CORPUS, vocab_size=400, special_tokens=SIMPLE_SPECIAL_TOKENS)


@pytest.fixture()
def tiny_actor(tiny_tokenizer):
    from polyturn.models.actor import tiny_actor

    return tiny_actor(tiny_tokenizer, hidden=32, layers=2, heads=4, seed=0)


EXAMPLE_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "meeting_booking",
                           "src")


@pytest.fixture(scope="session")
def meeting_env() -> str:
    """The example plugin's env id, registered: by its entry point when ``make`` installed it, else by register()."""
    import importlib.util
    import sys

    from polyturn.acting.registry import register

    if importlib.util.find_spec("meeting_booking") is None:  # not installed (a bare checkout): import it from source
        sys.path.insert(0, EXAMPLE_SRC)
    from meeting_booking.spec import SPEC

    register(SPEC)
    return SPEC.id


@pytest.fixture(scope="session")
def hierarchical_ckpt(tmp_path_factory, tiny_tokenizer):
    """A tiny hierarchical checkpoint, trained once a session (``tests.serve.conftest.hierarchical_checkpoint``)."""
    from tests.serve.conftest import hierarchical_checkpoint

    return hierarchical_checkpoint(tmp_path_factory.mktemp("hierarchy"), tiny_tokenizer)


def hier_tiny_cfg(out, env_id: str, *extra: str):
    """A two-iteration hierarchical run of configs/test_tiny.yaml on ``env_id`` (tests/train/test_hierarchy.py),
    the manager with a KL penalty to its BC policy of its own (``hierarchy.manager_kl``)."""
    from pathlib import Path

    from polyturn.config import load_config

    return load_config(Path(__file__).parents[1] / "configs" / "test_tiny.yaml", [
        f"run.out_dir={out}", f"env.id={env_id}", "hierarchy={k: 3, intrinsic: 0.5, manager_kl: 0.05}", "bc.episodes=8",
        "critic.privileged=true", "curriculum.warmup_iters=0", "curriculum.mixed_iters=1", "curriculum.ppo_iters=1",
        *extra])


class StepsReporter:
    """A reporter that keeps the steps counted on it (the trainer's ``rep.sub``, or its ``sub`` passed alone):
    ``steps``, each ``[name, total, units advanced]``; ``calls``, each advance as ``(name, n)``. The rest reports
    nothing."""

    def __init__(self) -> None:
        self.steps: list[list] = []
        self.calls: list[tuple[str, int]] = []

    def sub(self, name: str, total: int):
        row = [name, total, 0]
        self.steps.append(row)

        def advance(n: int = 1) -> None:
            row[2] += n
            self.calls.append((name, n))

        return advance

    def start(self, name: str, total: int) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def metrics(self, phase: str, step: int, metrics: dict) -> None:
        pass

    def message(self, text: str) -> None:
        pass


@pytest.fixture(scope="session")
def hier_sql_run(tmp_path_factory):
    """One two-iteration hierarchical SQL run (:func:`hier_tiny_cfg`), trained once a session; tests read it only
    (copy it to change it). The steps it counted on its reporter (name, total, units advanced) are in
    ``steps.json`` beside the run directory."""
    from polyturn.train.trainer import Trainer

    rep = StepsReporter()
    out = tmp_path_factory.mktemp("hier_sql_run") / "run"
    Trainer(hier_tiny_cfg(out, "polyturn/SQLAnalyst-v0"), reporter=rep).run()
    (out.parent / "steps.json").write_text(json.dumps(rep.steps))
    return out
