"""Evaluation: metrics, reports, preference ratings, error analysis and training diagnostics.

Modules (import what you need; none is imported here, to keep ``import polyturn`` light):

* :mod:`~polyturn.eval.runner` — :func:`evaluate`, the ``polyturn evaluate`` library function;
* :mod:`~polyturn.eval.testcases` — test-case files, :func:`make_test_cases`;
* :mod:`~polyturn.eval.metrics` — task / dialogue / system metrics with one-line definitions;
* :mod:`~polyturn.eval.stats` — Wilson intervals, z / Welch / bootstrap / jackknife tests;
* :mod:`~polyturn.eval.report`, :mod:`~polyturn.eval.document`, :mod:`~polyturn.eval.figures` — report.md / report.html;
* :mod:`~polyturn.eval.clusters` — failure signatures and embedding clusters;
* :mod:`~polyturn.eval.decision_tree` — surrogate decision tree of a policy;
* :mod:`~polyturn.eval.preference`, :mod:`~polyturn.eval.rate_server` — pairwise ratings (human or judge);
* :mod:`~polyturn.eval.diagnose` — ``polyturn diagnose``: training curves, a critic check and the training-health
  warnings of :mod:`polyturn.health.checks`.

Policies, checkpoints and running them on tasks live one layer down, in :mod:`polyturn.acting`; what is
specific to an environment (key actions, failure names, its own metrics, the judge's task description) comes
from its :class:`~polyturn.envs.spec.EnvSpec`. Evaluation never imports the trainer.

docs/evaluation.md explains the report and every metric.
"""
