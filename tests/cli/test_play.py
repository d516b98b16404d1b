"""polyturn play in one seat of a multi-role env."""

from __future__ import annotations

NEG = "polyturn/Negotiation-v0"


def test_play_runs_a_seat_of_a_multi_role_env_and_refuses_what_does_not_fit(capsys):
    from polyturn.cli import main

    multi = ["--env", NEG, "--env-kwargs", '{"opponent": "self"}']
    assert main(["play", "--policy", "random", *multi, "--role", "second", "--partner", "fair", "--seed", "3"]) == 0
    assert "They make the first offer" in capsys.readouterr().out
    assert main(["play", "--policy", "expert", *multi]) == 2
    assert "single-agent form" in capsys.readouterr().err
    assert main(["play", "--policy", "random", *multi, "--partner", "tit_for_tat"]) == 2  # evaluation-only
    assert "partner among" in capsys.readouterr().err
    assert main(["play", "--policy", "random", "--env", NEG, "--role", "second"]) == 2
    assert "only with a multi-role env" in capsys.readouterr().err
