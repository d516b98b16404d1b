"""polyturn: train LLM agents for multi-turn, tool-using dialogue with an asymmetric actor-critic.

Importing the package registers its environments with gymnasium, so
``gymnasium.make("polyturn/SQLAnalyst-v0")`` works after ``import polyturn``.
"""

from polyturn import envs as envs  # noqa: F401  (registers the environments)

__version__ = "0.1.0"
