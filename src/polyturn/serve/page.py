"""The chat page served at ``/``: plain HTML and a little JS over the session endpoints (a hierarchical version's
session shows the subgoal its manager set last)."""

INDEX_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>polyturn serve</title>
<style>
body{font-family:system-ui,sans-serif;max-width:860px;margin:2em auto;padding:0 1em}
#log{border:1px solid #ccc;border-radius:6px;padding:.6em;height:420px;overflow-y:auto;background:#fafafa}
.msg{margin:.35em 0;white-space:pre-wrap}.user{color:#0645ad}.agent{color:#222}
.tool{color:#6a4;font-family:monospace;font-size:.9em}.err{color:#b00}#goal{color:#845;margin:.4em 0}
form{display:flex;gap:.5em;margin-top:.6em}#text{flex:1}
</style></head><body>
<h1>polyturn serve</h1>
<p>
<label>Session <select id="kind"><option value="chat">plain chat</option>
<option value="env">environment task (the server runs the tools)</option></select></label>
<label>env <select id="env"></select></label>
<label>seed <input id="seed" type="number" value="0" min="0" style="width:6em"></label>
<button id="open" type="button">New session</button>
<button id="step" type="button" disabled>Agent step</button>
<span id="status"></span>
</p>
<div id="goal"></div>
<div id="log"></div>
<form id="form"><input id="text" placeholder="Your message" autocomplete="off" disabled>
<button id="send" disabled>Send</button></form>
<script>
let sid = null, kind = "chat";
const $ = (id) => document.getElementById(id);
function add(cls, text) {
  const d = document.createElement("div"); d.className = "msg " + cls; d.textContent = text;
  $("log").appendChild(d); $("log").scrollTop = $("log").scrollHeight; return d;
}
async function call(method, path, body) {
  const r = await fetch(path, {method, headers: {"content-type": "application/json"},
                               body: body === undefined ? undefined : JSON.stringify(body)});
  const data = await r.json();
  if (!r.ok) throw new Error((data.error && data.error.message) || r.statusText);
  return data;
}
function showGoal(s) {
  const g = s && s.hierarchy && s.hierarchy.subgoal;
  $("goal").textContent = g ? "subgoal " + s.hierarchy.subgoals.length + " (set by the manager): " + g.name +
                              " \u2014 " + g.text : "";
}
function showTurns(turns) {
  for (const t of turns) {
    add("agent", "agent: " + t.action);
    if (t.observation !== undefined) add("tool", "[" + (t.tool || "?") + "] " + t.observation);
  }
}
$("open").onclick = async () => {
  try {
    if (sid) await call("DELETE", "/v1/sessions/" + sid).catch(() => {});
    kind = $("kind").value;
    const body = kind === "env" ? {env: $("env").value, seed: Number($("seed").value)} : {};
    const s = await call("POST", "/v1/sessions", body);
    sid = s.id; $("log").innerHTML = ""; showGoal(s);
    $("status").textContent = "session " + s.id.slice(0, 12) + "... on " + s.model;
    if (kind === "env") add("user", "task: " + s.question);
    $("text").disabled = $("send").disabled = kind !== "chat";
    $("step").disabled = kind !== "env";
  } catch (e) { add("err", "error: " + e.message); }
};
$("step").onclick = async () => {
  try {
    const r = await call("POST", "/v1/sessions/" + sid + "/turns", {max_steps: 1});
    showTurns(r.turns); showGoal(r.session);
    if (r.session.done) { add("tool", "episode over: " + (r.session.success ? "success" : "failure"));
                          $("step").disabled = true; }
  } catch (e) { add("err", "error: " + e.message); }
};
$("form").onsubmit = async (ev) => {
  ev.preventDefault();
  const text = $("text").value.trim(); if (!text || !sid) return;
  $("text").value = ""; add("user", "you: " + text);
  try { const r = await call("POST", "/v1/sessions/" + sid + "/turns", {message: text});
        showTurns(r.turns); showGoal(r.session); }
  catch (e) { add("err", "error: " + e.message); }
};
call("GET", "/v1/envs").then((r) => {
  for (const id of r.data) { const o = document.createElement("option"); o.value = o.textContent = id;
                             o.selected = id === r.default; $("env").appendChild(o); }
}).catch((e) => add("err", "error: " + e.message));
setInterval(() => { if (sid) fetch("/v1/sessions/" + sid + "/heartbeat", {method: "POST"}); }, 30000);
</script></body></html>
"""
