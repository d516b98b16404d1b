"""The vLLM server's failures a user can cause are one-line errors (no vLLM needed: these run in every suite)."""

from __future__ import annotations

import sys

import pytest

from polyturn.rollout.vllm_server import VLLMError, VLLMServer


def _model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def test_a_missing_vllm_environment_says_how_to_install_it(tmp_path):
    server = VLLMServer(_model_dir(tmp_path), python=tmp_path / "no-venv" / "bin" / "python")
    with pytest.raises(VLLMError, match=r"make vllm-venv"):
        server.start()


def test_a_server_that_exits_at_start_is_reported_with_its_log(tmp_path):
    fake = tmp_path / "python"  # stands in for the venv's interpreter: prints an error and exits 3
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint('ValueError: no such model')\nsys.exit(3)\n")
    fake.chmod(0o755)
    server = VLLMServer(_model_dir(tmp_path), python=fake, log_path=tmp_path / "server.log")
    with pytest.raises(VLLMError, match=r"exited with status 3(.|\n)*no such model"):
        server.start()
