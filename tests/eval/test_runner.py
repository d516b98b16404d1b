"""``evaluate`` end to end: two tiny checkpoints plus the expert on real SQL tasks."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from polyturn.acting.policies import resolve_policy
from polyturn.eval.runner import evaluate

pytestmark = pytest.mark.xdist_group("runner")  # one test process builds the module fixtures, once

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Injected into a copy of report.html: after load, record for every <img> whether it decoded
# (naturalWidth > 0) and whether it has ink (more than 100 pixels differ from the corner pixel).
RENDER_CHECK = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images), ok = 0, inked = 0;
  imgs.forEach(function (i) {
    if (!(i.complete && i.naturalWidth > 0 && i.naturalHeight > 0)) return;
    ok++;
    var c = document.createElement('canvas'); c.width = i.naturalWidth; c.height = i.naturalHeight;
    var g = c.getContext('2d'); g.drawImage(i, 0, 0);
    var d = g.getImageData(0, 0, c.width, c.height).data, n = 0;
    for (var k = 0; k < d.length; k += 4) {
      if (d[k] !== d[0] || d[k + 1] !== d[1] || d[k + 2] !== d[2]) n++;
    }
    if (n > 100) inked++;
  });
  var el = document.createElement('div'); el.id = 'render-check';
  el.textContent = 'loaded=' + ok + ' inked=' + inked + ' total=' + imgs.length;
  document.body.appendChild(el);
});
</script>"""


def render_check(html_path: Path, tmp: Path) -> tuple[int, int, int]:
    """(decoded, inked, total) images of an HTML page in headless Chromium."""
    page = tmp / "check.html"
    page.write_text(html_path.read_text().replace("</body>", RENDER_CHECK + "</body>"))
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp / 'chromium-profile'}", "--virtual-time-budget=10000", "--dump-dom",
           page.resolve().as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<div id="render-check">loaded=(\d+) inked=(\d+) total=(\d+)</div>', out)
    assert m, f"the render check did not run; Chromium printed: {out[-500:]}"
    return int(m[1]), int(m[2]), int(m[3])


def episodes(out: Path) -> dict[str, list[dict]]:
    """Episode files without timing fields (which differ between runs)."""
    res = {}
    for f in sorted((out / "episodes").glob("*.jsonl")):
        recs = [json.loads(x) for x in f.read_text().splitlines()]
        for r in recs:
            for t in r["turns"]:
                t.pop("latency_s", None)
                t.pop("gen_s", None)
        res[f.stem] = recs
    return res


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, ckpt_run, cases_file, minilm):
    out = tmp_path_factory.mktemp("eval")
    calls = []
    data = evaluate([str(ckpt_run / "ckpt-a"), str(ckpt_run / "ckpt-b"), "expert"], cases_file, out_dir=out,
                    visualize=True, num_envs=4, progress=calls.append, embedder=minilm, n_boot=200)
    return out, data, calls


def test_evaluate_writes_both_reports_for_two_checkpoints_and_the_expert(evaluated):
    out, data, calls = evaluated
    assert data.policies == ["ckpt-a", "ckpt-b", "expert"]
    assert sum(calls) == 3 * 6
    assert {p.name for p in out.iterdir()} == {"episodes", "figures", "metrics.json", "report.md", "report.html"}
    eps = episodes(out)
    assert set(eps) == {"ckpt-a", "ckpt-b", "expert"}
    for name, recs in eps.items():
        assert [r["case_id"] for r in recs] == [f"c{s}" for s in range(6)]
        assert all(r["policy"] == name and 1 <= len(r["turns"]) <= 3 and not r["crashed"] for r in recs)
    actor_turns = [t for r in eps["ckpt-a"] for t in r["turns"]]
    assert all(t["n_tokens"] >= 1 for t in actor_turns)
    # Each turn's share of its batched decode step is part of its latency; with 4 rows per step the
    # shares add up to less than the per-row latencies (which each count the whole step).
    timed = [t for line in (out / "episodes" / "ckpt-a.jsonl").read_text().splitlines()
             for t in json.loads(line)["turns"]]
    assert all(0 < t["gen_s"] <= t["latency_s"] for t in timed)
    assert sum(t["gen_s"] for t in timed) < sum(t["latency_s"] for t in timed)
    assert data.values["ckpt-a"]["tokens_per_s"].value > 0
    assert data.values["expert"]["tokens_per_s"].value is None
    # The expert inspects the schema first in every case: key-action accuracy > 0, unlike untrained actors.
    assert data.values["expert"]["key_action_accuracy"].value > 0.3
    assert data.values["ckpt-a"]["invalid_action_rate"].value > 0.5


def test_report_numbers_in_html_equal_those_in_markdown(evaluated, numbers):
    out, data, _ = evaluated
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert numbers.assert_same(md, html) > 300
    v = data.values["expert"]["success_rate"]
    row = next(line for line in md.splitlines() if line.startswith("| Success rate |"))
    assert f"{v.value:.3f} [{v.lo:.3f}, {v.hi:.3f}] ({v.count[0]}/{v.count[1]})" in row
    _, images = numbers.html(html)
    assert len(images) == len(list((out / "figures").glob("*.png"))) == 7


def test_html_figures_render_in_chromium(evaluated, tmp_path):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); the HTML render check needs it")
    out, data, _ = evaluated
    loaded, inked, total = render_check(out / "report.html", tmp_path)
    assert total == 4 + 3  # four evaluation figures and one decision tree per policy
    assert loaded == total and inked == total


def test_render_check_notices_a_broken_figure(evaluated, tmp_path):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); the HTML render check needs it")
    out, _, _ = evaluated
    broken = tmp_path / "broken.html"
    html = (out / "report.html").read_text()
    broken.write_text(html.replace("data:image/png;base64,iVBOR", "data:image/png;base64,AAAA", 1))
    loaded, _, total = render_check(broken, tmp_path)
    assert loaded == total - 1


def test_greedy_evaluation_is_reproducible(tmp_path, evaluated, ckpt_run, cases_file):
    out, _, _ = evaluated
    evaluate([str(ckpt_run / "ckpt-a"), str(ckpt_run / "ckpt-b"), "expert"], cases_file, out_dir=tmp_path,
             visualize=False, num_envs=4, embedder=None, n_boot=50)
    assert episodes(tmp_path) == episodes(out)


def test_sampled_evaluation_is_reproducible_with_a_seed(tmp_path, ckpt_run, cases_file):
    runs = {}
    for name, seed in (("s1", 3), ("s2", 3), ("s3", 4)):
        evaluate([str(ckpt_run / "ckpt-a")], cases_file, out_dir=tmp_path / name, visualize=False,
                 temperature=1.0, seed=seed, num_envs=4, embedder=None, n_boot=20)
        runs[name] = episodes(tmp_path / name)
    assert runs["s1"] == runs["s2"]
    actions = {k: [t["action"] for r in v["ckpt-a"] for t in r["turns"]] for k, v in runs.items()}
    assert actions["s1"] != actions["s3"]


def test_a_crashing_case_is_recorded_not_fatal(tmp_path, ckpt_run):
    cases = [{"id": "ok", "env": "polyturn/SQLAnalyst-v0", "seed": 1, "options": {"max_turns": 2}},
             {"id": "bad", "env": "polyturn/SQLAnalyst-v0", "seed": 2, "options": {"level": 9}}]
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(json.dumps(c) for c in cases))
    calls = []
    data = evaluate([str(ckpt_run / "ckpt-a"), "expert"], path, out_dir=tmp_path / "out", visualize=False,
                    embedder=None, n_boot=20, progress=calls.append)
    assert sum(calls) == 4
    for p in ("ckpt-a", "expert"):
        recs = {r["case_id"]: r for r in data.records[p]}
        assert not recs["ok"]["crashed"] and recs["ok"]["turns"]
        assert recs["bad"]["crashed"] and "level" in recs["bad"]["crash"]
        assert data.values[p]["crash_rate"].count == (1, 2)
    assert "crash \\| last_error=none" in (tmp_path / "out" / "report.md").read_text()


def test_random_policy(tmp_path, cases_file):
    a = evaluate(["random"], cases_file, out_dir=tmp_path / "a", visualize=False, embedder=None, seed=5, n_boot=20)
    b = evaluate(["random"], cases_file, out_dir=tmp_path / "b", visualize=False, embedder=None, seed=5, n_boot=20)
    assert episodes(tmp_path / "a") == episodes(tmp_path / "b")
    assert a.values["random"]["invalid_action_rate"].value == 0.0  # sampled actions are valid
    assert b.values["random"]["success_rate"].value is not None


def test_policy_resolution(tmp_path, ckpt_run):
    assert resolve_policy("expert").kind == "expert"
    spec = resolve_policy(str(ckpt_run / "ckpt-a" / "actor"))
    assert spec.kind == "actor" and spec.label == "ckpt-a" and spec.config.rollout.max_action_tokens == 16
    assert resolve_policy(str(ckpt_run)).label == "ckpt-b"  # a run dir: its latest checkpoint
    with pytest.raises(FileNotFoundError, match="expert, random"):
        resolve_policy(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="actor/"):
        resolve_policy(str(tmp_path))


def test_duplicate_checkpoint_names_get_unique_labels(tmp_path, ckpt_run, cases_file):
    other = tmp_path / "run2" / "ckpt-a"
    shutil.copytree(ckpt_run / "ckpt-a", other)
    one_case = tmp_path / "one.json"
    one_case.write_text(json.dumps([json.loads(cases_file.read_text())[0]]))
    data = evaluate([str(ckpt_run / "ckpt-a"), str(other)], one_case, out_dir=tmp_path / "out", visualize=False,
                    embedder=None, n_boot=20)
    assert data.policies == ["ckpt-a", "run2/ckpt-a"]
