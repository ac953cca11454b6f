# Sourced by suite.sh and gpu_check.sh once they have set RESULT_DIR and WORK: the run's start, and
# `log` and `step`, so that each step runs under its own time limit inside the run's budget (BUDGET_S,
# which may be set later) and whatever finished is reported.
mkdir -p "$RESULT_DIR"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)

log() { echo "[$(date +%T) +$(($(date +%s) - START))s] $*" | tee -a "$WORK/progress.log"; }
# step NAME LIMIT_S CMD...: CMD under a time limit that also respects the run's budget. STEPS, when
# set, names the steps to run; LIMIT_SCALE stretches every limit (a slow machine); a step is skipped
# once under STEP_MIN_LEFT_S (15) of the budget is left; AFTER_STEP (a command) runs after each.
step() {
    local name=$1 limit=$2; shift 2
    if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then return 0; fi
    local left=$((BUDGET_S - ($(date +%s) - START)))
    if [ "$left" -lt "${STEP_MIN_LEFT_S:-15}" ]; then log "skip $name (budget spent)"; return 1; fi
    limit=$((limit * ${LIMIT_SCALE:-1}))
    [ "$limit" -gt "$left" ] && limit=$left
    log "start $name (limit ${limit}s)"
    timeout -k 5 "$limit" "$@" >"$WORK/$name.log" 2>&1
    local rc=$?
    log "end $name rc=$rc"
    grep -v -E "it/s\]|s/it\]|Loading weights" "$WORK/$name.log" | tail -n "${STEP_TAIL_LINES:-15}"
    ${AFTER_STEP:-}
    return $rc
}
