"""``polyturn serve`` as a command: a subprocess on a loopback port; shutdown records open sessions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import torch

from polyturn.acting.jsonl import read_jsonl
from tests.serve.conftest import free_port


@pytest.mark.slow
def test_serve_command_serves_and_records_open_sessions_at_shutdown(checkpoints, data_dir, tmp_path):
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "POLYTURN_ADMIN_TOKEN": ""}
    proc = subprocess.Popen([sys.executable, "-m", "polyturn.cli", "serve", "--checkpoint", str(checkpoints[0]),
                             "--port", str(port), "--record", str(tmp_path / "rec"), "--data-dir", str(data_dir)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "server did not start"
            time.sleep(0.2)
        s = httpx.post(url + "/v1/sessions", json={"env": "polyturn/SQLAnalyst-v0", "seed": 2,
                                                   "database": "shop.db"}).json()
        r = httpx.post(url + f"/v1/sessions/{s['id']}/turns", json={"max_steps": 1}, timeout=30)
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    (rec,) = read_jsonl(tmp_path / "rec" / "sessions.jsonl")
    assert rec["session_id"] == s["id"] and rec["end_reason"] == "shutdown" and len(rec["turns"]) == 1


@pytest.mark.parametrize("where", ["nope", "empty"])
def test_serve_command_missing_checkpoint_is_a_one_line_error(tmp_path, capsys, where):
    """Refused before the server starts (main() in this process; the subprocess test below covers the process)."""
    from polyturn.cli import main

    (tmp_path / "empty").mkdir()  # a directory, but no checkpoint in it: failed at startup with a traceback
    assert main(["serve", "--checkpoint", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err and "Started server" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without a GPU")
def test_serve_device_flag_without_a_gpu_is_a_one_line_error(checkpoints):
    out = subprocess.run([sys.executable, "-m", "polyturn.cli", "serve", "--checkpoint", str(checkpoints[0]),
                          "--device", "cuda"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--device = 'cuda' but this torch build sees no CUDA GPU" in out.stderr


@pytest.mark.parametrize("flags, message", [
    (["--ope-margin", "0.05"], "--ope-margin: Expected recorded sessions of the incumbent"),
    (["--ope-margin", "0.05", "--record", "REC", "--ope-estimator", "dr"],
     "--ope-estimator dr: expected --ope-metric return"),
    (["--ope-margin", "0.05", "--ope-data", "nowhere.jsonl"],
     "--ope-data: expected recorded sessions, got 'nowhere.jsonl'"),
])
def test_serve_ope_gate_mistakes_are_one_line_errors(checkpoints, tmp_path, capsys, flags, message):
    """Caught before the server starts (main() in this process: ServeConfig is built before uvicorn runs)."""
    from polyturn.cli import main

    flags = [str(tmp_path / "rec") if f == "REC" else f for f in flags]
    assert main(["serve", "--checkpoint", str(checkpoints[0]), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err


def test_serve_ope_flags_reach_the_gate(checkpoints, tmp_path):
    """Every --ope-* flag lands in the gate's settings; without --ope-margin there is no gate."""
    from polyturn.cli.parser import build_parser
    from polyturn.cli.serve import ope_settings
    from polyturn.serve.ope_gate import OPEGateSettings

    base = ["serve", "--checkpoint", str(checkpoints[0]), "--record", str(tmp_path)]
    assert ope_settings(build_parser().parse_args(base)) is None
    args = build_parser().parse_args(
        [*base, "--ope-margin", "0.1", "--ope-metric", "return", "--ope-estimator", "dr", "--ope-clip", "5",
         "--ope-confidence", "0.9", "--ope-min-sessions", "30", "--ope-max-sessions", "300", "--ope-data",
         str(tmp_path)])
    assert ope_settings(args) == OPEGateSettings(margin=0.1, metric="return", estimator="dr", clip=5.0,
                                                 confidence=0.9, min_sessions=30, max_sessions=300,
                                                 data=[str(tmp_path)])


def _hierarchical_copy(ckpt, root):
    """``ckpt`` laid out as a hierarchical checkpoint (its actor as both policies): enough for the flag checks."""
    import shutil

    from polyturn.config import load_config, save_config

    out = root / "hier"
    shutil.copytree(ckpt, out)
    shutil.copytree(ckpt / "actor", out / "roles" / "worker" / "actor")
    save_config(load_config(None, ["env.id=polyturn/SQLAnalyst-v0", "hierarchy={k: 2}"]), out / "config.yaml")
    return out


@pytest.mark.parametrize("flags, message", [
    (["--engine", "vllm", "--vllm-python", "NOWHERE"], "run `make vllm-venv` to install it"),
    (["--engine", "vllm", "--vllm-python", "PYTHON", "--unbatched"], "--unbatched: expected it only with --engine "
                                                                     "home"),
    (["--engine", "vllm", "--vllm-python", "PYTHON", "--explore-epsilon", "0.1"],
     "--explore-epsilon: expected 0 with --engine vllm"),
    (["--engine", "vllm", "--vllm-python", "PYTHON", "HIER"], "Expected a flat checkpoint for --engine vllm"),
])
def test_serve_engine_vllm_mistakes_are_one_line_errors(checkpoints, tmp_path, capsys, flags, message):
    """Caught before any vLLM server starts: a missing environment, the home engine's own features, a
    hierarchical checkpoint (here the interpreter running the tests stands in for vLLM's)."""
    from polyturn.cli import main

    ckpt = _hierarchical_copy(checkpoints[0], tmp_path) if "HIER" in flags else checkpoints[0]
    flags = [{"NOWHERE": str(tmp_path / "no-venv" / "python"), "PYTHON": sys.executable}.get(f, f)
             for f in flags if f != "HIER"]
    assert main(["serve", "--checkpoint", str(ckpt), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err
    assert err.count("\n") == 1
