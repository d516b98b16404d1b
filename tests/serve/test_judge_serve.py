"""The LLM judge's happy path against a real ``polyturn serve``: a tiny checkpoint trained to answer judge prompts
with a score, served over HTTP, asked by the real ``openai`` client through ``polyturn judge``."""

from __future__ import annotations

import math

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
        # benchmarks/judge_agreement.py through the same server (--endpoint: no vLLM started): one score for all
        # three, s = 0.667 >= 0.5, so accuracy is the success share (2 of 3) and the ranking all ties (AUC 0.5).
        import importlib.util
        from pathlib import Path

        path = Path(__file__).resolve().parents[2] / "benchmarks" / "judge_agreement.py"
        spec = importlib.util.spec_from_file_location("judge_agreement", path)
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
        assert bench.main(["--data", str(data), "--endpoint", srv.url + "/v1", "--model", "judge", "--scoring",
                           "score", "--out", str(tmp_path / "agree")]) == 0
        assert "sessions | score | 3 (2) | 0 | 0.667 | 0.667 | 0.500 | n/a |" in capsys.readouterr().out


def test_yes_no_judge_against_polyturn_serve_top_logprobs(tmp_path, tiny_tokenizer, capsys):
    """``--scoring yes_no`` needs the first token's top log-probs: ``polyturn serve`` returns them (OpenAI's
    ``logprobs`` / ``top_logprobs``) from the batched home engine, so a served checkpoint can be that judge (one whose
    tokenizer writes Yes and No as single tokens, as pretrained ones do)."""
    import openai

    from tests.serve.conftest import fixed_reply_checkpoint

    ckpt = fixed_reply_checkpoint(tmp_path, tiny_tokenizer, name="yes-judge", reply="Yes")
    records = short_records()
    data, out = tmp_path / "sessions.jsonl", tmp_path / "judged.jsonl"
    write_jsonl(data, records)
    with RunningServer(create_app(ServeConfig(checkpoints=[str(ckpt)], max_message_chars=4000))) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "Did it work? Answer with one word: Yes or No."}]
        r = client.chat.completions.create(model="yes-judge", messages=msgs, temperature=0, max_tokens=4,
                                           logprobs=True, top_logprobs=5)
        content = r.choices[0].logprobs.content
        assert len(content) >= 1 and all(len(c.top_logprobs) == 5 for c in content)
        first = content[0]
        tops = [t.logprob for t in first.top_logprobs]
        assert tops == sorted(tops, reverse=True) and sum(math.exp(x) for x in tops) <= 1.0 + 1e-6
        assert first.top_logprobs[0].token == first.token and first.logprob == pytest.approx(tops[0], abs=1e-5)
        assert r.choices[0].message.content.startswith(first.token)  # greedy: the likeliest token was sampled
        plain = client.chat.completions.create(model="yes-judge", messages=msgs, temperature=0, max_tokens=4)
        assert plain.choices[0].logprobs is None
        for bad, said in (({"top_logprobs": 3}, "Expected logprobs: true with top_logprobs"),
                          ({"logprobs": True, "stream": True}, "Expected stream: false with logprobs: true")):
            with pytest.raises(openai.BadRequestError, match=said):
                client.chat.completions.create(model="yes-judge", messages=msgs, **bad)
        # polyturn judge reads the first token's alternatives from this server; the tiny tokenizer has no single
        # token for Yes (it writes 'Y' 'es'), so this judge's replies are malformed, said with the tokens it saw.
        args = ["judge", "--data", str(data), "--endpoint", srv.url + "/v1", "--model", "yes-judge", "--out",
                str(out), "--scoring", "yes_no", "--concurrency", "1"]
        assert main(args) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "Expected 'Yes' or 'No' among the judge's" in err and "got ['Y'," in err and "Traceback" not in err


def test_logprobs_requests_this_server_cannot_answer_are_refused():
    from types import SimpleNamespace

    from polyturn.serve.conversation import RequestError
    from polyturn.serve.openai_api import ChatCompletionRequest, _check_logprobs

    def body(**kw):
        return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **kw)

    home = SimpleNamespace(manager=None, engine=SimpleNamespace(reports_top_logprobs=True))
    other = SimpleNamespace(manager=None, engine=SimpleNamespace(reports_top_logprobs=False))  # --unbatched, vllm
    assert _check_logprobs(body(), home) == 0 and _check_logprobs(body(logprobs=True, top_logprobs=4), home) == 4
    assert _check_logprobs(body(logprobs=True), other) == 0  # the sampled tokens' own log-probs: every engine
    with pytest.raises(RequestError, match="Expected the batched home engine for top_logprobs"):
        _check_logprobs(body(logprobs=True, top_logprobs=4), other)
    with pytest.raises(RequestError, match="Expected a flat version for logprobs"):
        _check_logprobs(body(logprobs=True), SimpleNamespace(manager=object(), engine=home.engine))
