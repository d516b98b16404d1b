"""The acting layer: making environments, loading checkpoints and running policies, below train/eval/serve.

Modules (import what you need; nothing heavy is imported here, so ``import polyturn`` stays light):

* :mod:`~polyturn.acting.registry` — the env registry (built-ins and the ``polyturn.envs`` entry-point
  group), :func:`~polyturn.acting.registry.make_env` and the scripted experts;
* :mod:`~polyturn.acting.episodes` — running a text policy for an episode, demonstrations, transcripts;
* :mod:`~polyturn.acting.jsonl` — the one JSONL reader and writer (episode records, metrics);
* :mod:`~polyturn.acting.policies` — resolving a ``--policy_checkpoint`` argument, built-in text policies;
* :mod:`~polyturn.acting.checkpoint` — loading a checkpoint with its rollout settings and running its actor
  over tasks with the collector.
"""
