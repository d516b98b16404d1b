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


def test_play_server_plays_the_servers_env_sessions_to_their_end_and_they_are_recorded(tmp_path, checkpoints, data_dir,
                                                                                       capsys):
    """``--server``: each task a session of the server's env (here with a database from its --data-dir), played
    to the episode's end and closed, so --record writes it; transcripts then one summary line."""
    from polyturn.acting.jsonl import read_jsonl
    from polyturn.cli import main
    from polyturn.serve.app import create_app
    from polyturn.serve.service import ServeConfig
    from tests.serve.conftest import RunningServer

    cfg = ServeConfig(checkpoints=[str(c) for c in checkpoints], record_dir=str(tmp_path / "rec"),
                      data_dir=str(data_dir))
    with RunningServer(create_app(cfg)) as srv:
        argv = ["play", "--server", srv.url, "--env", "polyturn/SQLAnalyst-v0", "--env-kwargs", "{}"]
        assert main(argv) == 2  # the server makes its envs
        assert "Expected no --policy or --env-kwargs with --server" in capsys.readouterr().err
        argv = ["play", "--server", srv.url, "--episodes", "3", "--seed", "5", "--temperature", "1",
                "--files", '{"database": "shop.db"}', "--concurrency", "2"]
        assert main([*argv, "--model", "v2"]) == 0
        out = capsys.readouterr().out
        assert out.count("policy=v2") == 3 and "ACTION: list_tables[{}]" in out
        assert "played 3 episodes on" in out and "(v2 3)" in " ".join(out.split())
        said = " ".join(out.split())
        assert "the server recorded 3" in said and "greedy" not in said and "(level None)" not in out
        assert main(["play", "--server", srv.url, "--quiet"]) == 0  # the server's default env, greedy
        said = " ".join(capsys.readouterr().out.split())
        assert said.startswith("played 1 episodes on") and "(v1 1)" in said  # v1 takes all routed traffic
        assert "greedy (--temperature 0): `polyturn evaluate --offline` and the ramp's gate cannot weigh" in said
        assert main(["play", "--server", srv.url, "--seed", "9", "--max-turns", "1", "--quiet"]) == 0  # a user leaves
        assert "1.0 turns per episode, 1 left unfinished (no outcome)" in " ".join(capsys.readouterr().out.split())
        assert main([*argv, "--model", "v9"]) == 2  # the server's own message
        assert "HTTP 404" in capsys.readouterr().err
    recs = list(read_jsonl(tmp_path / "rec" / "sessions.jsonl"))
    recs = {r["seed"]: r for r in recs}
    assert sorted(recs) == [0, 5, 6, 7, 9]
    assert [recs[k]["policy_version"] for k in (0, 5, 6, 7)] == ["v1", "v2", "v2", "v2"]
    assert all(r["end_reason"] == "closed" for r in recs.values())
    assert all(recs[k]["turns"][-1]["terminated"] or recs[k]["turns"][-1]["truncated"] for k in (0, 5, 6, 7))
    last = recs[9]["turns"][-1]
    assert len(recs[9]["turns"]) == 1 and not (last["terminated"] or last["truncated"])


def test_play_server_errors_say_what_to_do(capsys):
    from polyturn.cli import main
    from tests.serve.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["play", "--server", url, "--episodes", "1"]) == 2
    assert f"Expected a polyturn serve at {url}, got no answer to GET /v1/envs" in capsys.readouterr().err
    assert main(["play", "--model", "v1", "--max-turns", "2"]) == 2
    assert "Expected --model, --max-turns only with --server URL" in capsys.readouterr().err
