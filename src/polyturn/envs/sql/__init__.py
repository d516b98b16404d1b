"""``polyturn/SQLAnalyst-v0``: a data query and analysis agent over SQLite (see :mod:`.env`)."""

from polyturn.envs.sql.env import SQLAnalystEnv, SQLAnalystWeights
from polyturn.envs.sql.expert import NoiseConfig, SQLExpert

__all__ = ["NoiseConfig", "SQLAnalystEnv", "SQLAnalystWeights", "SQLExpert"]
