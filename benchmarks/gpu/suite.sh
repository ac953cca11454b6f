#!/usr/bin/env bash
# Issue 4's figures in one prepared run: PROFILE=gpu (default; about 9 minutes on one H200), cpu (the
# 2-core machine, gpt2-small-llama) or smoke (a dry run of this script with the tiny preset):
#   bash benchmarks/gpu/suite.sh RESULT_DIR
#   PROFILE=cpu STEPS="policy_max policy_poisson50 policy_poisson90 policy_long90" bash benchmarks/gpu/suite.sh DIR
# STEPS names the steps to run (default: all); the policy steps at a Poisson rate need policy_max's.
# A first run (docs/benchmarks.md) needed 9.5 minutes and more: the policy runs now use 64 requests.
# 1. a TinyLlama-1.1B-shaped random-weight Llama in bfloat16 (benchmarks.workloads.make_model --preset llama-1b)
# 2. the dense-forward bound at batch 16
# 3. static vs transformers serve vs cbserve vs in-process at t=0 (benchmarks/specs/gpu-llama-1b.toml)
# 4. fused vs TGI policy: saturation (all at t=0, no concurrency cap), then Poisson at 50% and 90% of
#    the fused run's request throughput, then 90% with 2,000-token prompts mixed in
# 5. control-plane cost (null model, batch 1/16/64) and the real model's worker idle time per step
# Each step has its own time limit and the results are packed into RESULT_DIR/gpu-results.tar.gz after
# every step, so whatever finished comes back even if a later step runs out of time.
set -u -o pipefail
cd "$(dirname "$0")/../.."
RESULT_DIR=$(realpath -m "${1:-benchmarks/results/gpu}")
WORK=$(mktemp -d /tmp/gpu-run-XXXX)
source benchmarks/gpu/steps.sh
PROFILE=${PROFILE:-gpu}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1  # nothing is downloaded
source benchmarks/gpu/carry/carried_wheels.sh

pack() { tar czf "$RESULT_DIR/gpu-results.tar.gz" -C "$WORK" . 2>/dev/null; cp "$WORK/progress.log" "$RESULT_DIR/"; }
# After every step: its results come back even if a later one runs out of time.
AFTER_STEP=pack STEP_MIN_LEFT_S=20 STEP_TAIL_LINES=30

if [ "$PROFILE" = smoke ]; then
    DEVICE=cpu DTYPE=float32 PRESET=tiny MODEL=$WORK/model
    SPEC=benchmarks/specs/cpu-tiny.toml NUM=12 LONG=400 MAXLEN=512 BLOCKS=512 SEQS=8 CP_BATCHES=1,4
    OUT_CAP=64 REAL_OUT=16 BUDGET_TOKENS=512
elif [ "$PROFILE" = cpu ]; then
    DEVICE=cpu DTYPE=float32 PRESET=gpt2-small-llama MODEL=models/gpt2-small-llama
    SPEC=benchmarks/specs/cpu-gpt2-small.toml NUM=${NUM:-32} LONG=2000 MAXLEN=2048 BLOCKS=4096 SEQS=16
    CP_BATCHES=1,16,64 OUT_CAP=512 REAL_OUT=64 BUDGET_TOKENS=512 BUDGET_S=${BUDGET_S:-3600}
    LAUNCH_EXTRA=",num_threads=2" LIMIT_SCALE=${LIMIT_SCALE:-6}
else
    DEVICE=cuda DTYPE=bfloat16 PRESET=llama-1b MODEL=models/llama-1b
    SPEC=benchmarks/specs/gpu-llama-1b.toml NUM=64 LONG=2000 MAXLEN=4096 BLOCKS=16384 SEQS=128
    CP_BATCHES=1,16,64 OUT_CAP=512 REAL_OUT=64 BUDGET_TOKENS=2048
fi
BUDGET_S=${BUDGET_S:-560}  # the GPU lease's ten-minute call, less start-up (cpu: an hour)

{
    date -u; nvidia-smi 2>&1 | head -15; nproc
    $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
'transformers', transformers.__version__)"
    which redis-server
} >"$WORK/env.txt" 2>&1
cat "$WORK/env.txt"

if [ ! -f "$MODEL/config.json" ]; then
    STEPS_SAVED=${STEPS:-}; STEPS=""
    step make_model 150 $PY -m benchmarks.workloads.make_model "$MODEL" --preset "$PRESET" --device "$DEVICE" || exit 1
    STEPS=$STEPS_SAVED
fi
step dense_bound 60 $PY -m benchmarks.bounds.dense_bound --model "$MODEL" --batch-size 16 --context-len 176 \
    --steps 64 --device "$DEVICE" --dtype "$DTYPE"

# The issue's comparison, same workload as the CPU run.
if [ "$PROFILE" = smoke ]; then
    step compare_t0 200 $PY -m benchmarks.serve compare --spec "$SPEC" --model "$MODEL" --num-prompts "$NUM" \
        --disable-tqdm --result-file "$WORK/compare_t0.json"
else
    step compare_t0 200 $PY -m benchmarks.serve compare --spec "$SPEC" --disable-tqdm \
        --only static-16,cbserve,inprocess --result-file "$WORK/compare_t0.json"
    step compare_hf 150 $PY -m benchmarks.serve compare --spec "$SPEC" --disable-tqdm \
        --only cbserve,transformers-cb --result-file "$WORK/compare_hf.json"
fi

# Policies under the same load: fused steps (chunked prefill) vs TGI admission (no chunking).
WORKLOAD=(--model "$MODEL" --dataset capped-exponential --num-prompts "$NUM" --random-input-len 144
    --random-range-ratio 0.7778 --output-mean 64 --output-cap "$OUT_CAP" --seed 0 --percentiles 50,99
    --max-model-len "$MAXLEN" --disable-tqdm)
POLICY_ENV="device=$DEVICE${LAUNCH_EXTRA:-},BATCHER_MAX_NUM_SEQS=$SEQS,BATCHER_MAX_NUM_BATCHED_TOKENS=$BUDGET_TOKENS"
POLICY_ENV="$POLICY_ENV,BATCHER_ASYNC_SCHEDULING=true,WORKER_NUM_BLOCKS=$BLOCKS"
POLICIES=(--launch "fused=cbserve:$POLICY_ENV,BATCHER_SCHEDULING_POLICY=fused"
    --launch "tgi=cbserve:$POLICY_ENV,BATCHER_SCHEDULING_POLICY=tgi")
step policy_max 120 $PY -m benchmarks.serve compare "${POLICIES[@]}" "${WORKLOAD[@]}" \
    --request-rate inf --result-file "$WORK/policy_max.json"
MAX_RPS=${MAX_RPS:-$($PY -c "import json; print(json.load(open('$WORK/policy_max.json'))['systems']['fused']['summary']['request_throughput'])" 2>/dev/null || echo 1)}
log "max request throughput (fused, t=0): $MAX_RPS req/s"
for pct in 50 90; do
    rate=$($PY -c "print(round($MAX_RPS * $pct / 100, 3))")
    step "policy_poisson$pct" 120 $PY -m benchmarks.serve compare "${POLICIES[@]}" "${WORKLOAD[@]}" \
        --request-rate "$rate" --result-file "$WORK/policy_poisson$pct.json"
done
rate=$($PY -c "print(round($MAX_RPS * 0.9, 3))")
step policy_long90 120 $PY -m benchmarks.serve compare "${POLICIES[@]}" "${WORKLOAD[@]}" \
    --request-rate "$rate" --long-prompt-len "$LONG" --long-prompt-fraction 0.05 \
    --result-file "$WORK/policy_long90.json"

# Control plane: null model (no GPU work) on this machine's cores, then the real model on the GPU.
step control_null 90 $PY -m benchmarks.pipeline.control_plane --model "$MODEL" --batch-sizes "$CP_BATCHES" \
    --output-len 200 --result-file "$WORK/control_null.json"
step control_real 90 $PY -m benchmarks.pipeline.control_plane --model "$MODEL" --batch-sizes 16,64 \
    --output-len "$REAL_OUT" --real-model --device "$DEVICE" --result-file "$WORK/control_real.json"
log "done"
pack
