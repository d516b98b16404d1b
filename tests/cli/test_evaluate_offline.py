"""``polyturn evaluate --offline DATA --policy CKPT``: estimates on recorded sessions, and one-line refusals."""

from __future__ import annotations

import json

import pytest

from polyturn.acting.jsonl import write_jsonl
from polyturn.cli import main
from tests.serve.conftest import record_sessions

pytestmark = pytest.mark.xdist_group("cli_evaluate_offline")  # one test process builds the module fixtures, once


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("ope_cli")
    return root, *record_sessions(root, tiny_tokenizer)


def test_offline_evaluation_prints_and_writes_the_estimates(recorded, tmp_path, capsys):
    root, ckpts, records = recorded
    rc = main(["evaluate", "--offline", str(root / "rec"), "--policy", str(ckpts[1]), "--resamples", "200",
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "v2 on 7 recorded episodes" in err and "per-decision WIS return" in err
    assert "doubly robust: unavailable" in err and "holds no critic" in err
    rep = json.loads((tmp_path / "out" / "offline_eval.json").read_text())
    assert rep["episodes"] == 7 and rep["behaviour"] == {"v1": 7} and 1.0 <= rep["ess"] <= 7.0
    w = rep["wis"]["return"]
    assert w["lo"] <= w["value"] <= w["hi"]


def test_records_without_logprobs_are_refused_in_one_line(recorded, tmp_path, capsys):
    _, ckpts, records = recorded
    path = tmp_path / "eval_episodes.jsonl"  # what evaluation and rollouts write: no token ids, no log-probs
    write_jsonl(path, [{**r, "turns": [{k: v for k, v in t.items() if k not in ("action_ids", "logprobs")}
                                       for t in r["turns"]]} for r in records])
    rc = main(["evaluate", "--offline", str(path), "--policy", str(ckpts[0])])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.startswith("error:") and "Expected behaviour log-probs on every turn" in err
    assert main(["evaluate", "--offline", str(path)]) == 2
    assert "Expected --policy CKPT" in capsys.readouterr().err
