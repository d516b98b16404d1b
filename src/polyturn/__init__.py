"""polyturn: train LLM agents for multi-turn, tool-using dialogue with an asymmetric actor-critic.

Importing the package registers its environments (the built-in ones and those
of the ``polyturn.envs`` entry-point group) with gymnasium, so
``gymnasium.make("polyturn/SQLAnalyst-v0")`` works after ``import polyturn``.
"""

from polyturn import envs as envs  # noqa: F401
from polyturn.acting.registry import load_envs

load_envs()

__version__ = "0.1.0"
