#!/usr/bin/env bash
# Issue 12's GPU figures in one prepared run inside BUDGET_S (420 s, the carry's install and every
# compile included), so that a rerun fits in a 15-minute lease:
#   bash benchmarks/gpu/carry/gpu_wheels.sh               # on a machine with a registry: fills .whl/ (carry it)
#   bash benchmarks/gpu/gpu_check.sh [RESULT_DIR]   # on the GPU host; default docs/results
# Writes RESULT_DIR/gpu-check.json (the summary, also printed) and RESULT_DIR/gpu-check-logs.tar.gz.
# First the carry (carried_wheels.sh): the lock's wheels installed, the host's versions checked, and
# every module the steps import tried; the first that fails ends the run, named in the summary.
# Then the toolchain: Triton builds a C launcher for each kernel, which needs a C compiler ($CC, gcc
# or clang) and Python.h; without them (or when a real Triton kernel fails to launch on the GPU) the
# run goes on with WORKER_ATTENTION_BACKEND=torch and WORKER_COMPILE=false, and skips the kernels.
# Then the steps, the most informative first, each under its own limit; the limits of the first
# four are reserved (steps.sh), so no step before them can spend them:
# 1. parity_bfloat16: greedy parity with transformers' generate in bf16 (demo model, benchmarks/gpu/gpu_parity.py),
# 2. decode: the worker's compiled Decoder, built as the worker builds it, on a Llama-3-8B-shaped model
#    at batch 1/16/64/128 with 1,024-token contexts: the forward timed by CUDA events, the step on the
#    host, both against the copy bandwidth (benchmarks/worker_step/decode_roofline.py),
# 3. make_model and e2e_16: the TinyLlama-shaped spec end to end at 16 in flight;
# then, in what the budget leaves: parity_float32 (token for token), e2e_64 (64 in flight), kernels
# (every Triton kernel against the torch reference on CUDA) and control (the worker's idle time
# between steps at batch 64, async scheduling). A step cut or skipped is named under "missing", and
# RESULT_DIR/gpu-check.json's "steps" gives every step's limit, seconds and exit status.
# PROFILE=smoke runs the same steps at toy sizes on the CPU inside the same budget (a dry run of this
# script; CC=false there exercises the torch fallback); only its decode step compiles (the CPU test
# suite checks the compiled forward's parity). Every run compiles into its own cache, cold as on a
# fresh host. Nothing is downloaded (HF_HUB_OFFLINE=1) and pytest loads no plugin by entry point.
set -u -o pipefail
cd "$(dirname "$0")/../.."
RESULT_DIR=$(realpath -m "${1:-docs/results}")
WORK=$(mktemp -d /tmp/gpu-check-XXXX)
source benchmarks/gpu/steps.sh  # the budget counts from here
BUDGET_S=${BUDGET_S:-420} TAIL_S=${TAIL_S:-15}
PROFILE=${PROFILE:-gpu}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
export WORKER_COMPILE_CACHE_DIR=$WORK/compile-cache

if [ "$PROFILE" = smoke ]; then
    DEVICE=cpu DTYPE=bfloat16 SHAPE=tiny BATCHES=1,4 CONTEXT=64 PRESET=tiny MODEL=$WORK/model
    SPEC_ARGS=(--spec benchmarks/specs/cpu-tiny.toml --only cbserve --model "$MODEL" --num-prompts 8)
    SPEC64_ARGS=("${SPEC_ARGS[@]}") CP_BATCH=4 NUM_PROMPTS=4 KERNEL_ENV=(TRITON_INTERPRET=1)
    # Eager outside the decode step (each compile costs tens of seconds on two shared cores), and
    # 16 tokens a parity request (its imports and transformers' generate are most of the step here).
    EAGER=(env WORKER_COMPILE=false) PARITY_ARGS=(--max-tokens 16)
    L_PARITY=90 L_DECODE=120 L_MODEL=30 L_E2E=60 L_PARITY32=60 L_E2E64=45 L_KERNELS=45 L_CONTROL=45
else
    DEVICE=cuda DTYPE=bfloat16 SHAPE=llama3-8b BATCHES=1,16,64,128 CONTEXT=1024 PRESET=llama-1b
    MODEL=models/llama-1b SPEC_ARGS=(--spec benchmarks/specs/gpu-llama-1b.toml --only cbserve)
    SPEC64_ARGS=(--spec benchmarks/specs/gpu-llama-1b-64.toml) CP_BATCH=64 NUM_PROMPTS=24 KERNEL_ENV=()
    EAGER=() PARITY_ARGS=()
    L_PARITY=75 L_DECODE=120 L_MODEL=40 L_E2E=120 L_PARITY32=60 L_E2E64=60 L_KERNELS=60 L_CONTROL=45
fi
reserve "parity_bfloat16:$L_PARITY" "decode:$L_DECODE" "make_model:$L_MODEL" "e2e_16:$L_E2E"
[ -f "$MODEL/config.json" ] && unreserve make_model

summarize() {
    timeout 30 $PY -m benchmarks.gpu.gpu_summary "$WORK" --out "$RESULT_DIR/gpu-check.json" \
        --budget-s "$BUDGET_S" --started "$START"
    tar czf "$RESULT_DIR/gpu-check-logs.tar.gz" -C "$WORK" . 2>/dev/null
}

{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi 2>&1 | head -15; nproc; } >"$WORK/env.txt" 2>&1
if ! source benchmarks/gpu/carry/carried_wheels.sh >>"$WORK/env.txt" 2>&1; then
    cat "$WORK/env.txt"
    reason=$(grep -m1 -E "cannot (import|install)" "$WORK/env.txt" || echo "carried_wheels.sh failed")
    log "stopped: $reason"
    echo "$reason" >"$WORK/stopped.txt"
    summarize
    exit 1
fi
cat "$WORK/env.txt"
source benchmarks/gpu/toolchain.sh
TRITON_OK=0
probe_toolchain "$DEVICE"  # exports the torch fallback when Triton cannot build or launch a kernel

step parity_bfloat16 "$L_PARITY" ${EAGER[@]+"${EAGER[@]}"} $PY -m benchmarks.gpu.gpu_parity --model models/demo \
    --device "$DEVICE" --dtype bfloat16 --num-prompts "$NUM_PROMPTS" ${PARITY_ARGS[@]+"${PARITY_ARGS[@]}"} \
    --result-file "$WORK/parity_bfloat16.json"
step decode "$L_DECODE" $PY -m benchmarks.worker_step.decode_roofline --shape "$SHAPE" --batches "$BATCHES" \
    --context "$CONTEXT" --device "$DEVICE" --dtype "$DTYPE" --result-file "$WORK/decode.json"
if [ ! -f "$MODEL/config.json" ]; then
    step make_model "$L_MODEL" $PY -m benchmarks.workloads.make_model "$MODEL" --preset "$PRESET" --device "$DEVICE"
fi
step e2e_16 "$L_E2E" ${EAGER[@]+"${EAGER[@]}"} $PY -m benchmarks.serve compare "${SPEC_ARGS[@]}" --disable-tqdm \
    --result-file "$WORK/e2e_16.json"
step parity_float32 "$L_PARITY32" ${EAGER[@]+"${EAGER[@]}"} $PY -m benchmarks.gpu.gpu_parity --model models/demo \
    --device "$DEVICE" --dtype float32 --num-prompts "$NUM_PROMPTS" ${PARITY_ARGS[@]+"${PARITY_ARGS[@]}"} \
    --result-file "$WORK/parity_float32.json"
step e2e_64 "$L_E2E64" ${EAGER[@]+"${EAGER[@]}"} $PY -m benchmarks.serve compare "${SPEC64_ARGS[@]}" --disable-tqdm \
    --result-file "$WORK/e2e_64.json"
# The kernel tests, wherever the test tree keeps them.
KERNEL_TESTS=$(find tests -name test_triton_attention.py -print -quit)
if [ "$TRITON_OK" = 1 ] || [ "$DEVICE" = cpu ]; then
    step kernels "$L_KERNELS" env CBSERVE_TEST_DEVICE="$DEVICE" "${KERNEL_ENV[@]}" $PY -m pytest -q \
        -p no:cacheprovider "$KERNEL_TESTS" --junitxml="$WORK/kernels.xml"
else
    skip kernels "Triton cannot build its launcher here: see toolchain.json"
fi
step control "$L_CONTROL" ${EAGER[@]+"${EAGER[@]}"} $PY -m benchmarks.pipeline.control_plane --model "$MODEL" \
    --batch-sizes "$CP_BATCH" --output-len 64 --real-model --device "$DEVICE" --scheduling async \
    --result-file "$WORK/control.json"
log "done"
summarize
