"""The report: one data structure, two renderings with the same numbers."""

from __future__ import annotations

import json

import pytest

from polyturn.eval.document import Code, Heading, Image, Para, Table, to_html, to_markdown
from polyturn.eval.report import build_report, write_report

def test_number_extraction_would_notice_a_difference(numbers):
    blocks = [Heading("T", 1), Para("x 1.50 y"), Table(("a",), (("2.000",),)), Code("3 | 4")]
    md, html = to_markdown(blocks), to_html(blocks, title="9")
    assert numbers.assert_same(md, html) == 4
    with pytest.raises(AssertionError):
        numbers.assert_same(md.replace("2.000", "2.001"), html)


def test_markdown_and_html_render_the_same_blocks():
    blocks = [Heading("Title", 1), Para("a < b & c"), Table(("x", "y|z"), (("1", "2"),)), Code("```x```"),
              Image("fig", "Figure: f.", b"\x89PNG fake")]
    md = to_markdown(blocks)
    html = to_html(blocks, title="t")
    assert "| x | y\\|z |" in md and "````text" in md and "![](figures/fig.png)" in md
    assert "a &lt; b &amp; c" in html and 'src="data:image/png;base64,' in html
    assert "http" not in html.lower().replace("http-equiv", "")  # no external assets


@pytest.fixture()
def synthetic_records(ep):
    good = [ep.expert_like(f"c{i}", level=1 + i % 3, ambiguous=i % 4 == 0) for i in range(12)]
    bad = []
    for i in range(12):
        if i % 3 == 0:
            bad.append(ep.expert_like(f"c{i}", level=1 + i % 3))
        else:
            bad.append(ep.record([ep.turn('Action: run_sql[{"sql": "SELEC 1"}]', "run_sql", error="sql_error",
                                          after="SQL error: near SELEC", terms={"penalty/turn_cost": -0.01}),
                                  ep.turn("hello hello", "invalid", error="format", after="Format error",
                                          terms={"penalty/unparseable": -0.2})],
                                 case_id=f"c{i}", level=1 + i % 3))
    return {"good": good, "bad": bad}


def test_report_files_and_numbers(tmp_path, synthetic_records, minilm, numbers):
    data = build_report(synthetic_records, embedder=minilm, n_boot=200, meta={"test_cases": "x.json", "cases": 12})
    paths = write_report(data, tmp_path, visualize=True)
    md = paths["markdown"].read_text()
    html = paths["html"].read_text()
    n = numbers.assert_same(md, html)
    assert n > 200
    _, images = numbers.html(html)
    pngs = sorted(p.name for p in (tmp_path / "figures").glob("*.png"))
    assert len(images) == len(pngs) == 6  # 4 evaluation figures + a decision tree per policy
    assert all(src.startswith("data:image/png;base64,iVBORw0KGgo") for src in images)
    for section in ("## Metrics", "## Differences against good", "## Metric definitions", "## Success by difficulty level",
                    "## Reward terms", "## Error patterns", "## Policy decision trees", "## Transcripts"):
        assert section in md
    assert "| Success rate | task | 1.000 [0.758, 1.000] (12/12) | 0.333 [0.138, 0.609] (4/12) |" in md
    sig = "no_answer | last_error=format | missing=inspect_schema,submit_answer"
    assert sig.replace("|", "\\|") in md
    metrics = json.loads(paths["metrics"].read_text())
    assert metrics["metrics"]["bad"]["success_rate"]["count"] == [4, 12]
    comp = next(c for c in metrics["comparisons"] if c["metric"] == "success_rate")
    assert comp["significant"] and comp["test"] == "z" and comp["diff"] == pytest.approx(4 / 12 - 1)
    # Paired on the 12 cases: "bad" solves only what "good" solves too (4), and loses the other 8.
    (pair,) = metrics["paired_success"]
    assert pair == {"policy": "bad", "baseline": "good", "cases": 12, "gained": 0, "lost": 8, "p": pytest.approx(2 / 2 ** 8)}
    assert "| bad | 12 | 0 | 8 | 0.008 | yes |" in md


def test_without_visualize_only_markdown_and_metrics(tmp_path, synthetic_records):
    data = build_report(synthetic_records, embedder=None, n_boot=50)
    paths = write_report(data, tmp_path, visualize=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "report.md"]
    md = paths["markdown"].read_text()
    assert "![](" not in md and "| Coherence | dialogue | n/a | n/a |" in md


def test_baseline_and_compare_to(synthetic_records):
    data = build_report(synthetic_records | {"third": synthetic_records["good"]}, baseline="bad",
                        compare_to=["good"], n_boot=50)
    assert {(c.baseline, c.policy) for c in data.comparisons} == {("bad", "good")}
    assert [(d["policy"], d["gained"], d["lost"]) for d in data.paired] == [("good", 8, 0)]
    # Records of other cases than the baseline's pair with nothing: no paired row.
    other = [dict(r, case_id=f"x{i}") for i, r in enumerate(synthetic_records["good"])]
    assert build_report({"bad": synthetic_records["bad"], "other": other}, n_boot=50).paired == []
    with pytest.raises(ValueError, match="baseline"):
        build_report(synthetic_records, baseline="nope")


def test_metric_definitions_take_their_examples_from_the_env_spec(tmp_path, synthetic_records):
    def definitions(env_id: str) -> str:
        records = {p: [dict(r, env_id=env_id) for r in rs] for p, rs in synthetic_records.items()}
        md = write_report(build_report(records, n_boot=20), tmp_path / env_id, visualize=False)["markdown"].read_text()
        return md.split("## Metric definitions")[1].split("\n## ")[0]

    sql = definitions("polyturn/SQLAnalyst-v0")
    assert "inspect_schema = list_tables or describe_table" in sql and "(sql_timeout)" in sql
    for env_id in ("polyturn/CustomerService-v0", "polyturn/TwentyQuestions-v0"):
        text = definitions(env_id)
        assert not any(word in text for word in ("list_tables", "describe_table", "sql_timeout", "answer")), text
        assert "the action type of the same name" in text and "names none, so always 0" in text


def test_a_hierarchical_workers_subgoals_get_their_own_section(tmp_path):
    """Worker records of a hierarchical agent (made by the demonstrations' replay) show each subgoal's episodes,
    turns and how often it was reached; a flat agent's records show no such section."""
    from polyturn.acting.hierarchy import hierarchical_demos
    from polyturn.eval.report import subgoal_stats

    recs = [r for r in hierarchical_demos("polyturn/SQLAnalyst-v0", episodes=6, noise=0.0, seed=0, k=4)
            if r["role"] == "worker"]
    stats = subgoal_stats(recs)
    assert set(stats) == {"inspect", "query", "answer"} | ({"clarify"} if any(r["ambiguous"] for r in recs) else set())
    assert stats["inspect"]["episodes"] == 6 and stats["inspect"]["reached"] == 1.0
    assert stats["answer"]["reached"] == 1.0  # its check is the episode's success, which every expert episode has
    data = build_report({"hier": recs}, n_boot=10)
    md = (write_report(data, tmp_path, visualize=False)["markdown"]).read_text()
    assert "## Subgoals" in md and "| hier | inspect | 6 |" in md
    assert json.loads((tmp_path / "metrics.json").read_text())["subgoals"]["hier"]["inspect"]["episodes"] == 6
    flat = [{**r, "turns": [{**t, "info": {k: v for k, v in t["info"].items() if k != "subgoal"}}
                            for t in r["turns"]]} for r in recs]
    assert "## Subgoals" not in (write_report(build_report({"flat": flat}, n_boot=10), tmp_path / "f",
                                              visualize=False)["markdown"]).read_text()
