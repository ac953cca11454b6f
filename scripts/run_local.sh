#!/usr/bin/env bash
# Starts the batcher, WORKERS gpu workers and the gateway as local processes against REDIS_URL.
# Ctrl-C (or any service exiting) stops them all.
set -euo pipefail
: "${MODEL:?set MODEL to a model directory (tokenizer.json + weights)}"
PY=${PY:-.venv/bin/python}
PORT=${PORT:-8000}
WORKERS=${WORKERS:-1}
export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}

pids=()
cleanup() {
  trap - INT TERM EXIT
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
}
trap cleanup INT TERM EXIT

"$PY" -m batcher & pids+=($!)
for _ in $(seq "$WORKERS"); do
  "$PY" -m gpu_worker --model "$MODEL" & pids+=($!)
done
"$PY" -m gateway --host 127.0.0.1 --port "$PORT" --model "$MODEL" & pids+=($!)
echo "gateway on http://127.0.0.1:$PORT (Redis: $REDIS_URL); Ctrl-C stops everything"
wait -n
