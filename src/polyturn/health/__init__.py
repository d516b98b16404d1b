"""Training health: signals and checks over a run's ``metrics.jsonl``, read by the trainer and ``polyturn diagnose``.

Modules (import what you need; none is imported here):

* :mod:`~polyturn.health.signals` — a run's records, one metric's series, its noise, window shifts, action diversity;
* :mod:`~polyturn.health.checks` — the checks (reward spikes and hacking, collapse, oscillation, plateau, critic
  divergence ...), each judged against the noise of what it reads;
* :mod:`~polyturn.health.warning` — what a check reports: :class:`~polyturn.health.warning.TrainingWarning`, the
  seed's remedies and the printed form.

This layer sits above :mod:`polyturn.acting` and below both :mod:`polyturn.train` (which checks a run while it
trains) and :mod:`polyturn.eval` (whose ``diagnose`` checks it afterwards), so neither of those imports the other.
"""
