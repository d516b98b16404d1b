"""A/B routing: shares over 1,000 routed sessions through a ramp, its guard and a rollback; sticky live sessions."""

from __future__ import annotations

import json
import math
import shutil
import time

import httpx
import pytest

from polyturn.serve.app import create_app
from polyturn.serve.routing import Router
from polyturn.serve.service import ServeConfig
from tests.serve.conftest import ADMIN_TOKEN, RunningServer

N = 1000


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def route(router: Router, n: int = N) -> dict[str, int]:
    counts = {a: 0 for a in router.arms}
    for _ in range(n):
        arm = router.choose()
        counts[arm] += 1
        router.record(arm, error=False)
    return counts


def within(count: int, share: float, n: int = N) -> bool:
    """Within 4 binomial standard deviations (exact at shares 0 and 1)."""
    return abs(count - n * share) <= 4 * math.sqrt(n * share * (1 - share)) + 1e-9


def test_ramp_moves_traffic_5_20_100_over_1000_sessions_each():
    clock = Clock()
    r = Router(["v1", "v2"], seed=1, clock=clock)
    assert route(r) == {"v1": N, "v2": 0}
    r.start_ramp("v2", dwell_s=60, min_samples=20)
    for share in (0.05, 0.2):
        counts = route(r)
        assert within(counts["v2"], share), (share, counts)
        clock.t += 30
        r.tick()
        assert r.shares["v2"] == share  # dwell not over yet
        clock.t += 30
        r.tick()
    assert r.shares["v2"] == 1.0
    assert route(r) == {"v1": 0, "v2": N}
    clock.t += 60
    r.tick()
    assert r.ramp.status == "done" and r.stable == "v2"
    r.rollback()  # a promotion that turns out bad is undone after it completed too
    assert route(r) == {"v1": N, "v2": 0} and r.stable == "v1"


def test_guard_stops_the_ramp_on_errors_and_traffic_returns():
    clock = Clock()
    r = Router(["v1", "v2"], seed=2, clock=clock)
    r.start_ramp("v2", stages=(0.05, 0.2, 1.0), dwell_s=10, max_error_rate=0.05, min_samples=20)
    served = 0
    while r.ramp.status == "running":
        arm = r.choose()
        r.record(arm, error=(arm == "v2" and served % 5 == 0))  # v2 fails 1 in 5 of its requests
        served += arm == "v2"
    assert r.ramp.status == "stopped" and "error rate" in r.ramp.reason
    assert route(r) == {"v1": N, "v2": 0}


def test_guard_stops_the_ramp_on_low_success():
    clock = Clock()
    r = Router(["v1", "v2"], seed=3, clock=clock)
    r.start_ramp("v2", dwell_s=10, min_success_rate=0.5, min_samples=10)
    for _ in range(10):
        r.record_outcome("v2", success=False)
    r.record_outcome("v1", success=False)  # the baseline's outcomes do not count against v2
    r.tick()
    assert r.ramp.status == "stopped" and "success rate" in r.ramp.reason
    assert r.shares == {"v1": 1.0, "v2": 0.0}


def test_rollback_mid_ramp_sends_everything_back_at_once():
    clock = Clock()
    r = Router(["v1", "v2"], seed=4, clock=clock)
    r.start_ramp("v2", dwell_s=5, min_samples=1)
    route(r, 200)
    clock.t += 5
    r.tick()
    assert r.shares["v2"] == 0.2
    assert within(route(r)["v2"], 0.2)
    r.rollback()
    assert route(r) == {"v1": N, "v2": 0}
    assert [e["event"] for e in r.state()["events"]][-2:] == ["ramp_stopped", "rollback"]


def test_shares_set_by_hand_over_1000_sessions():
    r = Router(["v1", "v2", "v3"], seed=5)
    r.set_shares({"v1": 2, "v2": 1, "v3": 1})
    counts = route(r)
    for arm, share in (("v1", 0.5), ("v2", 0.25), ("v3", 0.25)):
        assert within(counts[arm], share), counts
    with pytest.raises(ValueError, match="unknown"):
        r.set_shares({"v4": 1})


def test_live_sessions_keep_their_version_through_shifts_loads_and_rollback(checkpoints, tmp_path):
    root = checkpoints[0].parent
    v3 = root / "v3"
    if not v3.exists():
        shutil.copytree(checkpoints[1], v3)
    cfg = ServeConfig(checkpoints=[str(checkpoints[0]), str(checkpoints[1])], admin_token=ADMIN_TOKEN)
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    with RunningServer(create_app(cfg)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        old = [c.post("/v1/sessions", json={}).json() for _ in range(3)]
        assert {s["model"] for s in old} == {"v1"}
        assert c.post("/admin/routing/shares", json={"shares": {"v2": 1}}, headers=auth).status_code == 200
        new = c.post("/v1/sessions", json={}).json()
        assert new["model"] == "v2"
        r = c.post("/admin/versions", json={"checkpoint": str(v3), "name": "v3"}, headers=auth)
        assert r.status_code == 200, r.text
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["auto", "v1", "v2", "v3"]
        for s in old + [new]:  # loading a version dropped no live session; each stays on its version
            out = c.post(f"/v1/sessions/{s['id']}/turns", json={"message": "hello"})
            assert out.status_code == 200 and out.json()["session"]["model"] == s["model"]
        r = c.post("/admin/routing/ramp", json={"version": "v3", "dwell_s": 3600}, headers=auth).json()
        assert r["shares"]["v3"] == 0.05 and r["ramp"]["baseline"] == "v2"
        r = c.post("/admin/routing/rollback", headers=auth).json()
        assert r["shares"] == {"v1": 0.0, "v2": 1.0, "v3": 0.0} and r["ramp"]["status"] == "stopped"
        assert 'polyturn_arm_share{arm="v2"} 1.0' in c.get("/metrics").text


def test_server_errors_are_counted_and_stop_the_ramp(checkpoints):
    """A version whose engine has stopped answers 500 (and an error event when streaming, after the 200): both
    count in /metrics and in the ramp's error rate, whose guard then sends traffic back, and the client sees
    no internal detail."""
    cfg = ServeConfig(checkpoints=[str(checkpoints[0]), str(checkpoints[1])], admin_token=ADMIN_TOKEN,
                      reap_every_s=0.1)
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    with RunningServer(create_app(cfg)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        srv.app.state.service.versions["v2"].engine.stop()  # the new version is broken: every turn fails
        r = c.post("/admin/routing/ramp", headers=auth,
                   json={"version": "v2", "stages": [0.5, 1.0], "dwell_s": 0, "max_error_rate": 0.05,
                         "min_samples": 4})
        assert r.status_code == 200 and r.json()["shares"]["v2"] == 0.5
        body = {"model": "v2", "messages": [{"role": "user", "content": "hello"}]}
        for _ in range(2):
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 500 and r.json()["error"]["message"] == "Internal server error"
            assert r.headers["connection"] == "close"  # the server closes it: the client must not reuse it
        for _ in range(2):
            r = c.post("/v1/chat/completions", json={**body, "stream": True})
            assert r.status_code == 200  # the status line goes out before the turn runs
            last = json.loads(r.text.strip().splitlines()[-1].removeprefix("data: "))
            assert last["error"] == {"message": "Internal server error", "type": "server_error", "param": None,
                                     "code": None}
        state = c.get("/admin/routing", headers=auth).json()
        assert state["arms"]["v2"]["requests"] == 4 and state["arms"]["v2"]["errors"] == 4
        deadline = time.time() + 10
        while state["ramp"]["status"] == "running" and time.time() < deadline:  # the reaper ticks the ramp
            time.sleep(0.1)
            state = c.get("/admin/routing", headers=auth).json()
        assert state["ramp"]["status"] == "stopped" and "error rate" in state["ramp"]["reason"]
        assert state["shares"] == {"v1": 1.0, "v2": 0.0}
        metrics = c.get("/metrics").text
        assert 'polyturn_errors_total{arm="v2",endpoint="/v1/chat/completions",status="500"} 4.0' in metrics


def test_guard_stops_the_ramp_on_violations_per_session():
    clock = Clock()
    r = Router(["v1", "v2"], seed=5, clock=clock)
    r.start_ramp("v2", dwell_s=10, max_cost_per_session={"cost/violation": 0.25}, min_samples=4)
    for violations in (0.0, 1.0, 0.0):  # 1/3 per session, but only 3 sessions: too few to judge
        r.record_costs("v2", {"cost/violation": violations, "cost/error_response": 2.0})
    for _ in range(6):
        r.record_costs("v1", {"cost/violation": 1.0})  # the baseline's sessions do not count against v2
    r.tick()
    assert r.ramp.status == "running"
    r.record_costs("v2", {"cost/violation": 0.0})  # 1 violation in 4 sessions: at the limit, not over it
    r.tick()
    assert r.ramp.status == "running"
    r.record_costs("v2", {"cost/violation": 1.0})  # 2 in 5
    r.tick()
    assert r.ramp.status == "stopped" and r.ramp.reason == "cost/violation 0.400 per session > 0.25"
    assert r.shares == {"v1": 1.0, "v2": 0.0}
    assert r.state()["arms"]["v2"]["episodes"] == 5 and r.state()["arms"]["v2"]["costs"]["cost/error_response"] == 6
    with pytest.raises(ValueError, match="max_cost_per_session"):
        r.start_ramp("v2", max_cost_per_session={"cost/violation": -1.0})


def test_costs_are_counted_per_arm_and_guard_a_ramp_on_a_real_server(checkpoints):
    """CustomerService sessions whose agent answers with a tool the env does not have: every turn is an error
    response. /metrics counts each cost term per arm, and a ramp guarded on error responses per session stops."""
    cfg = ServeConfig(checkpoints=[str(checkpoints[0]), str(checkpoints[1])], admin_token=ADMIN_TOKEN,
                      reap_every_s=0.1)
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    with RunningServer(create_app(cfg)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/admin/routing/ramp", headers=auth,
                   json={"version": "v2", "stages": [0.5, 1.0], "dwell_s": 600, "min_samples": 2,
                         "max_cost_per_session": {"cost/error_response": 5.0}})
        assert r.status_code == 200 and r.json()["ramp"]["max_cost_per_session"] == {"cost/error_response": 5.0}
        for seed, model in ((0, "v2"), (1, "v2"), (2, "v1")):
            s = c.post("/v1/sessions", json={"env": "polyturn/CustomerService-v0", "seed": seed, "model": model}).json()
            turns = c.post(f"/v1/sessions/{s['id']}/turns", json={"max_steps": 14}).json()["turns"]
            assert len(turns) == 14 and all(t["error"] for t in turns)  # the turn limit ends the episode
        state = c.get("/admin/routing", headers=auth).json()
        assert state["arms"]["v2"]["episodes"] == 2 and state["arms"]["v2"]["costs"]["cost/error_response"] == 28
        deadline = time.time() + 10
        while state["ramp"]["status"] == "running" and time.time() < deadline:  # the reaper ticks the ramp
            time.sleep(0.1)
            state = c.get("/admin/routing", headers=auth).json()
        assert state["ramp"]["status"] == "stopped"
        assert state["ramp"]["reason"] == "cost/error_response 14.000 per session > 5.0"
        assert state["shares"] == {"v1": 1.0, "v2": 0.0}
        metrics = c.get("/metrics").text
        assert 'polyturn_costs_total{arm="v2",term="cost/error_response"} 28.0' in metrics
        assert 'polyturn_costs_total{arm="v2",term="cost/violation"} 0.0' in metrics
        assert 'polyturn_costs_total{arm="v1",term="cost/error_response"} 14.0' in metrics


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


def test_an_off_policy_gate_holds_the_ramp_at_20_percent_until_its_check_passes():
    import threading

    from polyturn.serve.routing import GateVerdict

    release = threading.Event()
    calls = []

    def gate(arm: str, baseline: str) -> GateVerdict:
        calls.append((arm, baseline))
        release.wait(10)
        return GateVerdict(True, "good enough", {"lower": 0.5})

    clock = Clock()
    r = Router(["v1", "v2"], seed=1, clock=clock, gate=gate)
    r.start_ramp("v2", dwell_s=0, min_samples=0)
    assert r.ramp.gate["status"] == "waiting"
    r.tick()
    assert r.shares["v2"] == 0.2 and not calls  # 5% -> 20% needs no check
    r.tick()
    _wait(lambda: calls)
    for _ in range(3):  # the check runs: the ramp stays at 20% and routing goes on
        r.tick()
        assert route(r, 200)["v2"] > 0 and r.shares["v2"] == 0.2 and r.ramp.gate["status"] == "running"
    release.set()
    _wait(lambda: r.ramp.gate["status"] == "passed")
    assert calls == [("v2", "v1")] and r.ramp.gate["lower"] == 0.5
    r.tick()
    assert r.shares["v2"] == 1.0
    assert [e["event"] for e in r.events if e["event"].startswith("ope_gate")] == ["ope_gate_start", "ope_gate_passed"]


def test_a_failed_gate_stops_the_ramp_and_says_why_and_rollback_does_not_wait():
    import threading

    from polyturn.serve.routing import GateVerdict

    r = Router(["v1", "v2"], seed=1, gate=lambda arm, base: GateVerdict(False, f"{arm} is worse than {base}"))
    r.start_ramp("v2", dwell_s=0, min_samples=0)
    r.tick()
    r.tick()
    _wait(lambda: r.ramp.status == "stopped")
    assert r.shares == {"v1": 1.0, "v2": 0.0}
    assert r.ramp.reason == "refused past 20%: v2 is worse than v1" and r.ramp.gate["status"] == "failed"
    assert r.state()["events"][-1] == {**r.state()["events"][-1], "event": "ramp_stopped", "reason": r.ramp.reason}

    release = threading.Event()

    def slow(arm: str, base: str) -> GateVerdict:
        release.wait(10)
        return GateVerdict(True, "passed, too late")

    r = Router(["v1", "v2"], seed=1, gate=slow)
    r.start_ramp("v2", dwell_s=0, min_samples=0)
    r.tick()
    r.tick()  # the check starts
    t0 = time.perf_counter()
    assert r.rollback() == {"v1": 1.0, "v2": 0.0}
    assert time.perf_counter() - t0 < 0.1  # instant, the check still running
    release.set()
    time.sleep(0.2)
    assert r.ramp.status == "stopped" and r.ramp.reason == "rollback" and r.shares["v2"] == 0.0


def test_a_gate_that_cannot_run_refuses_the_ramp():
    from polyturn.serve.routing import GateVerdict

    def broken(arm: str, base: str) -> GateVerdict:
        raise FileNotFoundError("no records")

    r = Router(["v1", "v2"], seed=1, gate=broken)
    r.start_ramp("v2", stages=(0.05, 1.0), dwell_s=0, min_samples=0)  # no 20% stage: the check holds 5%
    r.tick()
    _wait(lambda: r.ramp.status == "stopped")
    assert "could not run: FileNotFoundError: no records" in r.ramp.reason
    r2 = Router(["v1", "v2"], seed=1, gate=broken)
    r2.start_ramp("v2", stages=(0.05, 0.2), dwell_s=0, min_samples=0)  # never past 20%: no check
    assert r2.ramp.gate["status"] == "off"
    with pytest.raises(ValueError, match=r"Expected a first stage at or below 20% .*got stages \[0.5, 1.0\]"):
        Router(["v1", "v2"], gate=broken).start_ramp("v2", stages=(0.5, 1.0))  # would skip the check
