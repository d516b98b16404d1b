"""The LLM judge's client against real local HTTP servers: scores, the cache, retries, timeouts, malformed replies."""

from __future__ import annotations

import json
import math
import time

import pytest

from polyturn.acting.episodes import generate_demos
from polyturn.acting.judge import (
    YES_NO_TEMPLATE,
    JudgeCache,
    JudgeError,
    MalformedReply,
    agreement,
    chat_completion,
    episode_key,
    judge_prompt,
    judge_records,
    normalized,
    outcome_known,
    parse_score,
    parse_yes_no,
    score_of,
    transcript,
)
from polyturn.acting.jsonl import read_jsonl, write_jsonl
from polyturn.cli import main
from tests.acting.judge_server import JudgeServer, oracle

SQL = "polyturn/SQLAnalyst-v0"


@pytest.fixture(scope="module")
def records() -> list[dict]:
    """Six SQL episodes of a noisy expert (some succeed, some do not)."""
    return list(generate_demos(SQL, episodes=6, noise=0.5, seed=0))


def test_parse_score_reads_the_last_line_strictly():
    assert parse_score("The answer is right.\nScore: 9") == 9
    assert parse_score("score: 3/10.\n\n") == 3
    for bad in ("", "Score: 11", "Score: 0", "Score: 7\nThen more text", "I would give it a 7", "Score: seven"):
        with pytest.raises(MalformedReply, match="Expected the judge's reply to end with a line 'Score: N'"):
            parse_score(bad)
    assert normalized(1) == 0.0 and normalized(10) == 1.0


def test_prompt_carries_the_env_rubric_and_the_conversation(records):
    from polyturn.acting.registry import env_spec

    rec = records[0]
    prompt = judge_prompt(rec)
    assert env_spec(SQL).task_description in prompt
    assert rec["question"] in prompt and rec["turns"][0]["action"][:40] in prompt
    assert prompt.rstrip().endswith("to 10 (perfect).")
    # The env's answer to the last action (its verdict) is not shown: a session with no outcome has none.
    assert rec["final_observation"].startswith("Answer submitted") and "Answer submitted" not in prompt
    assert rec["final_observation"] in transcript(rec, final=True) and rec["final_observation"] not in transcript(rec)
    # The key is the conversation's: timings and judge fields do not change it, an action does.
    timed = {**rec, "turns": [{**t, "latency_s": 123.0} for t in rec["turns"]], "judge": 0.5}
    assert episode_key(timed) == episode_key(rec)
    edited = {**rec, "turns": [{**rec["turns"][0], "action": "Final Answer: 0"}, *rec["turns"][1:]]}
    assert episode_key(edited) != episode_key(rec)


def test_outcome_known_for_ended_episodes_and_feedback_only():
    ended = {"env_id": SQL, "turns": [{"terminated": True}]}
    cut = {"env_id": SQL, "turns": [{"terminated": False, "truncated": False}]}
    assert outcome_known(ended) and not outcome_known(cut)
    assert outcome_known({**cut, "feedback": [{"outcome": "failure"}]})
    assert not outcome_known({"env_id": "chat", "turns": [{"terminated": False}], "feedback": [{"rating": 5}]})


def test_agreement_auc_accuracy_and_rank_correlation():
    a = agreement([1.0, 0.8, 0.2, 0.0], [True, True, False, False])
    assert a["auc"] == 1.0 and a["accuracy"] == 1.0 and a["spearman"] == pytest.approx(0.894, abs=1e-3)
    b = agreement([0.0, 0.2, 0.8, 1.0], [True, True, False, False])
    assert b["auc"] == 0.0 and b["accuracy"] == 0.0
    assert agreement([0.5, 0.5], [True, True])["auc"] is None


def test_judges_every_episode_with_a_concurrency_limit_and_caches_on_disk(records, tmp_path):
    cache_path = tmp_path / "cache.jsonl"
    with JudgeServer(oracle(records), delay=0.2) as srv:
        ask = chat_completion("judge-1", base_url=srv.url, timeout=5, max_retries=0)
        verdicts = judge_records(records, ask, model="judge-1", cache=JudgeCache(cache_path), concurrency=3)
        assert len(srv.prompts) == 6 and all(not v.cached for v in verdicts)
        assert srv.max_in_flight == 3  # 6 calls of 0.2 s, never more than 3 at a time
        assert all(b["temperature"] == 0 and b["max_tokens"] == 512 and "logprobs" not in b for b in srv.bodies)
        assert [v.score for v in verdicts] == [8 if r["success"] else 2 for r in records]
        assert 8 in [v.score for v in verdicts] and 2 in [v.score for v in verdicts]
        assert verdicts[0].value == normalized(verdicts[0].score)
        # Judging again (a new cache object reading the same file) sends nothing.
        again = judge_records(records, ask, model="judge-1", cache=JudgeCache(cache_path), concurrency=3)
        assert len(srv.prompts) == 6 and all(v.cached for v in again)
        assert [v.score for v in again] == [v.score for v in verdicts]
        # Another judge model is another verdict.
        judge_records(records[:1], chat_completion("judge-2", base_url=srv.url), model="judge-2",
                      cache=JudgeCache(cache_path))
        assert len(srv.prompts) == 7
    assert len(read_jsonl(cache_path)) == 7


def test_retries_a_500_and_then_answers(records):
    with JudgeServer(fail_first=2, fail_code=500) as srv:
        reply = chat_completion("j", base_url=srv.url, max_retries=2)(judge_prompt(records[0]))
        assert reply.endswith("Score: 7") and len(srv.prompts) == 3
    with JudgeServer(fail_first=5, fail_code=503) as srv:
        with pytest.raises(ValueError, match=r"answered HTTP 503: .*the judge fell over"):
            chat_completion("j", base_url=srv.url, max_retries=1)(judge_prompt(records[0]))
        assert len(srv.prompts) == 2


def test_a_slow_judge_times_out_is_retried_and_says_so(records):
    with JudgeServer(delay=3.0, delay_first=1) as srv:  # the first call hangs, the retry answers at once
        t0 = time.perf_counter()
        reply = chat_completion("j", base_url=srv.url, timeout=0.3, max_retries=1)(judge_prompt(records[0]))
        assert reply.endswith("Score: 7") and len(srv.prompts) == 2 and time.perf_counter() - t0 < 2.5
    with JudgeServer(delay=1.5) as srv:
        with pytest.raises(ValueError, match=r"could not reach it within 0.2 s and 1 retries"):
            chat_completion("j", base_url=srv.url, timeout=0.2, max_retries=1)(judge_prompt(records[0]))


def test_a_malformed_reply_is_a_clear_error_and_loses_nothing(records, tmp_path):
    bad = records[3]["question"]
    reply = lambda p: "I like it." if bad in p else "Score: 6"  # noqa: E731
    cache = JudgeCache(tmp_path / "cache.jsonl")
    with JudgeServer(reply) as srv:
        ask = chat_completion("j", base_url=srv.url)
        with pytest.raises(JudgeError, match=r"judging the 4th: Expected the judge's reply to end with a line "
                                             r"'Score: N' \(N from 1 to 10\), got 'I like it.'"):
            judge_records(records, ask, model="j", cache=cache, concurrency=1,
                          names=["the 1st", "the 2nd", "the 3rd", "the 4th", "the 5th", "the 6th"])
        assert len(srv.prompts) == 4 and len(JudgeCache(tmp_path / "cache.jsonl")) == 3  # the three before it kept
        # on_malformed="record": the episode gets the error, the others their scores, and only the rest is sent.
        out = judge_records(records, ask, model="j", cache=cache, concurrency=2, on_malformed="record")
        assert [v.cached for v in out] == [True, True, True, False, False, False] and len(srv.prompts) == 7
        assert out[3].score is None and "Score: N" in out[3].error and out[3].reply == "I like it."
        assert [v.score for i, v in enumerate(out) if i != 3] == [6] * 5


def test_polyturn_judge_writes_scores_resumes_and_reports_agreement(records, tmp_path, capsys):
    data = tmp_path / "sessions.jsonl"
    write_jsonl(data, records + [{**records[0], "turns": []}])
    out = tmp_path / "judged.jsonl"
    score = oracle(records, yes="Score: 9")
    with JudgeServer(lambda p: "no score" if records[2]["question"] in p else score(p)) as srv:
        args = ["judge", "--data", str(data), "--endpoint", srv.url, "--model", "j", "--out", str(out),
                "--concurrency", "1"]
        assert main(args) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"judging the episode at {data}:3" in err and "got 'no score'" in err and "Traceback" not in err
        assert "2 verdicts kept in" in err and not out.exists()
    with JudgeServer(score) as srv:
        args[args.index("--endpoint") + 1] = srv.url
        assert main(args) == 0
        assert len(srv.prompts) == 4  # the two judged before the failure came from the cache
    said = " ".join(capsys.readouterr().err.split())
    assert "judged 6 episodes (2 from" in said and "agreement with the outcome on 6 episodes" in said
    assert "accuracy 1.000 (score >= 0.5 read as success), AUC 1.000" in said
    judged = read_jsonl(out)
    assert len(judged) == 7 and "judge" not in judged[6]  # the record without turns is written back unjudged
    assert all(r["judge_model"] == "j" and r["judge"] == pytest.approx(normalized(r["judge_score"]), abs=1e-6)
               for r in judged[:6])
    # --on_malformed record: the episode keeps the error and the reply; judging the judged file replaces its fields.
    with JudgeServer(lambda p: "Hmm.\nno score" if records[2]["question"] in p else score(p)) as srv:
        again = tmp_path / "again.jsonl"
        assert main(["judge", "--data", str(out), "--endpoint", srv.url, "--model", "j2", "--out", str(again),
                     "--on_malformed", "record"]) == 0
        assert len(srv.prompts) == 6  # another model: nothing cached for it
    assert "1 malformed replies recorded as judge_error" in " ".join(capsys.readouterr().err.split())
    rejudged = read_jsonl(again)
    assert "judge" not in rejudged[2] and "got 'no score'" in rejudged[2]["judge_error"]
    assert rejudged[2]["judge_reply"] == "Hmm.\nno score" and rejudged[2]["judge_model"] == "j2"
    assert [r.get("judge_score") for i, r in enumerate(rejudged[:6]) if i != 2] == \
        [r["judge_score"] for i, r in enumerate(judged[:6]) if i != 2]
    assert main(["judge", "--data", str(data), "--endpoint", "http://127.0.0.1:9/v1", "--model", "j", "--out",
                 str(tmp_path / "x.jsonl"), "--retries", "0"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Expected an OpenAI-compatible server at http://127.0.0.1:9/v1/chat/completions, could not reach it" in err
    assert main(["judge", "--data", str(data), "--model", "j", "--out", str(data)]) == 2
    assert "Expected --out other than a --data file" in capsys.readouterr().err
    write_jsonl(tmp_path / "metrics.jsonl", [{"iter": 0, "charts/success_rate": 0.5}])
    assert main(["judge", "--data", str(tmp_path / "metrics.jsonl"), "--model", "j", "--out", str(out)]) == 2
    assert "Expected an episode record" in " ".join(capsys.readouterr().err.split())


def test_yes_no_reads_the_first_tokens_probabilities():
    # P(yes) = e^-0.5 + e^-2, P(no) = e^-1.5 (+ " NO" e^-4): other tokens do not count.
    top = {"Yes": -0.5, " yes": -2.0, "No": -1.5, " NO": -4.0, "The": -0.1}
    yes, no = math.exp(-0.5) + math.exp(-2.0), math.exp(-1.5) + math.exp(-4.0)
    assert parse_yes_no(json.dumps(top)) == pytest.approx(yes / (yes + no))
    assert parse_yes_no('{"no": -0.01}') == 0.0 and parse_yes_no('{"YES": -3}') == 1.0
    assert score_of(0.0) == 1 and score_of(1.0) == 10 and score_of(0.5) == 6
    with pytest.raises(MalformedReply, match=r"Expected 'Yes' or 'No' among the judge's 2 most likely first tokens, "
                                             r"got \['The', 'I'\]"):
        parse_yes_no('{"I": -2.0, "The": -0.1}')
    with pytest.raises(MalformedReply, match="top log-probs as JSON"):
        parse_yes_no("Yes")


def test_yes_no_judges_through_the_endpoints_log_probs(records, tmp_path):
    known = {judge_prompt(r, YES_NO_TEMPLATE): r["success"] for r in records}
    probs = lambda p: {"Yes": -0.2, "No": -1.8, "Maybe": -3.0} if known[p] else {"No": -0.1, " Yes": -2.5}  # noqa
    with JudgeServer(lambda p: "Yes", top_logprobs=probs) as srv:
        ask = chat_completion("j", base_url=srv.url, scoring="yes_no")
        cache = JudgeCache(tmp_path / "c.jsonl")
        out = judge_records(records, ask, model="j", cache=cache, scoring="yes_no")
        assert all(p.endswith("Answer with one word: Yes or No.") for p in srv.prompts)
        assert all(b["max_tokens"] == 1 and b["logprobs"] is True and b["top_logprobs"] == 20 for b in srv.bodies)
        hi, lo = 1 / (1 + math.exp(-1.6)), math.exp(-2.5) / (math.exp(-2.5) + math.exp(-0.1))
        assert [v.value for v in out] == pytest.approx([hi if r["success"] else lo for r in records])
        assert [v.score for v in out] == [score_of(v.value) for v in out]
        again = judge_records(records, ask, model="j", cache=JudgeCache(tmp_path / "c.jsonl"), scoring="yes_no")
        assert all(v.cached for v in again) and [v.value for v in again] == [v.value for v in out]
        assert len(srv.prompts) == 6
        # The other scoring asks another question: not answered from this cache.
        judge_records(records[:1], chat_completion("j", base_url=srv.url), model="j", cache=cache,
                      on_malformed="record")
        assert len(srv.prompts) == 7
        # The command: --scoring yes_no writes s as the record's judge, and its 1-10 figure.
        data, out_path = tmp_path / "eps.jsonl", tmp_path / "judged.jsonl"
        write_jsonl(data, records)
        assert main(["judge", "--data", str(data), "--endpoint", srv.url, "--model", "j", "--out", str(out_path),
                     "--scoring", "yes_no"]) == 0
        assert [r["judge"] for r in read_jsonl(out_path)] == pytest.approx([v.value for v in out], abs=1e-6)
        assert [r["judge_score"] for r in read_jsonl(out_path)] == [v.score for v in out]
    # An endpoint that returns no log-probs (polyturn serve, this server without them) says what yes_no needs.
    with JudgeServer(lambda p: "Yes") as srv:
        with pytest.raises(JudgeError, match=r"answered without top log-probs .* --scoring yes_no needs an endpoint "
                                             r"that returns them \(vLLM, OpenAI, polyturn serve's home engine\); "
                                             r"use --scoring score"):
            judge_records(records[:1], chat_completion("j", base_url=srv.url, scoring="yes_no"), model="j",
                          cache=JudgeCache(None), scoring="yes_no")
