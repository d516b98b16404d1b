"""The LLM judge's happy path against a real ``polyturn serve``: a tiny checkpoint trained to answer judge prompts
with a score, served over HTTP, asked by the real ``openai`` client through ``polyturn judge``."""

from __future__ import annotations

import pytest

from polyturn.acting.judge import judge_prompt, normalized
from polyturn.acting.jsonl import read_jsonl, write_jsonl
from polyturn.cli import main
from polyturn.serve.app import create_app
from polyturn.serve.service import ServeConfig
from tests.serve.conftest import RunningServer, make_checkpoint

pytestmark = pytest.mark.xdist_group("serve_judge")

VERDICT = "Score: 7"


def short_records() -> list[dict]:
    """Three one-turn SQL episodes (short prompts keep the tiny judge's training to seconds)."""
    qs = ["What was the total revenue of Fridge in 2022?", "How many orders came from Beijing in 2023?",
          "Which region sold the most TVs in 2024?"]
    return [{"env_id": "polyturn/SQLAnalyst-v0", "seed": i, "task_id": f"t{i}", "question": q, "success": i != 1,
             "turns": [{"observation": q, "action": f"Final Answer: {40 + i}", "reward": 10.0 if i != 1 else -5.0,
                        "terminated": True, "truncated": False}], "final_observation": "Submitted."}
            for i, q in enumerate(qs)]


def test_polyturn_judge_against_polyturn_serve(tmp_path, tiny_tokenizer, capsys):
    records = short_records()
    # The judge: a tiny actor that learned to answer the judge's prompt (about 400 tokens) with a verdict.
    ckpt = make_checkpoint(tmp_path, tiny_tokenizer, name="judge", seed=0, action=VERDICT, steps=100,
                           tasks=[judge_prompt(r) for r in records[:2]], context_budget=1024)
    data, out = tmp_path / "sessions.jsonl", tmp_path / "judged.jsonl"
    write_jsonl(data, records)
    with RunningServer(create_app(ServeConfig(checkpoints=[str(ckpt)], max_message_chars=4000))) as srv:
        args = ["judge", "--data", str(data), "--endpoint", srv.url + "/v1", "--model", "judge", "--out", str(out),
                "--timeout", "60", "--concurrency", "2"]
        assert main(args) == 0
        said = " ".join(capsys.readouterr().err.split())
        assert "judged 3 episodes (0 from" in said and "3 sent" in said
        judged = read_jsonl(out)
        assert [r["judge_score"] for r in judged] == [7, 7, 7]  # the third prompt was never trained on
        assert all(r["judge"] == pytest.approx(normalized(7), abs=1e-6) and r["judge_model"] == "judge"
                   for r in judged)
        assert main(args) == 0  # again: every verdict from the cache, nothing sent
        assert "judged 3 episodes (3 from" in " ".join(capsys.readouterr().err.split())
