"""The LLM judge's rubric names the task of the episodes' environment (its spec), not always the SQL analyst's."""

from __future__ import annotations

from polyturn.eval.preference import judge_prompt, make_pairs


def test_the_judge_prompt_takes_the_task_from_the_env_spec(ep):
    sql = [ep.expert_like("c0")]
    (pair,) = make_pairs(sql, sql, a_name="A", b_name="B", seed=0)
    prompt = judge_prompt(pair)
    assert prompt.startswith("You are judging two assistants, each an AI data analyst answering a user's request by "
                             "calling tools (list_tables, describe_table, run_sql, ask_user, plot, submit_answer). "
                             "Both were given the same request. Judge")
    neg = [dict(r, env_id="polyturn/Negotiation-v0") for r in sql]
    (pair,) = make_pairs(neg, neg, a_name="A", b_name="B", seed=0)
    prompt = judge_prompt(pair)
    assert prompt.startswith("You are judging two assistants, each an AI negotiator splitting")
    assert "run_sql" not in prompt.split("Request:")[0]
    unknown = [dict(r, env_id="someone/Unregistered-v0") for r in sql]
    (pair,) = make_pairs(unknown, unknown, a_name="A", b_name="B", seed=0)
    assert judge_prompt(pair).startswith("You are judging two assistants, each an AI assistant completing a task "
                                         "with tools. Both")
