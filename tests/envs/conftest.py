"""Fixtures for env tests: a private database cache and a shared generated sales database."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from polyturn.envs.sql.database import sales_db_path


@pytest.fixture(scope="session", autouse=True)
def polyturn_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Point ``$POLYTURN_CACHE`` at a fresh folder, so tests never touch ~/.cache."""
    folder = tmp_path_factory.mktemp("polyturn-cache")
    old = os.environ.get("POLYTURN_CACHE")
    os.environ["POLYTURN_CACHE"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("POLYTURN_CACHE", None)
    else:
        os.environ["POLYTURN_CACHE"] = old


@pytest.fixture(scope="session")
def sales_db(polyturn_cache: Path) -> Path:
    """The generated sales database for seed 0 (built once per session)."""
    return sales_db_path(0)


@pytest.fixture()
def env(sales_db: Path, tmp_path: Path):
    """A fresh analyst env on the session database, plots written under ``tmp_path``."""
    from polyturn.envs.sql.env import SQLAnalystEnv

    e = SQLAnalystEnv(db_path=sales_db, plot_dir=tmp_path / "plots")
    yield e
    e.close()
