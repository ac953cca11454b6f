# Sourced by suite.sh and gpu_check.sh once they have set RESULT_DIR and WORK: the run's start, and
# `log`, `reserve` and `step`, so that each step runs under its own time limit inside the run's budget
# (BUDGET_S, which may be set later) and whatever finished is reported. The budget counts from here:
# what the script does before its first step (installing wheels, probing the toolchain) spends it too.
mkdir -p "$RESULT_DIR"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)
RESERVED=()

log() { echo "[$(date +%T) +$(($(date +%s) - START))s] $*" | tee -a "$WORK/progress.log"; }
_wanted() { [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $1 "* ]]; }
# reserve NAME:LIMIT_S ...: later steps whose limits no step before them may spend, so that a slow
# early step cannot starve them; a step's own entry goes when it starts or is skipped.
reserve() {
    local entry
    for entry in "$@"; do _wanted "${entry%%:*}" && RESERVED+=("$entry"); done
}
unreserve() {
    local keep=() entry
    for entry in ${RESERVED[@]+"${RESERVED[@]}"}; do [ "${entry%%:*}" != "$1" ] && keep+=("$entry"); done
    RESERVED=(${keep[@]+"${keep[@]}"})
}
_reserved_s() {
    local total=0 entry
    for entry in ${RESERVED[@]+"${RESERVED[@]}"}; do total=$((total + ${entry##*:} * ${LIMIT_SCALE:-1})); done
    echo "$total"
}
# skip NAME WHY: a step not run, logged and recorded as such.
skip() {
    unreserve "$1"
    log "skip $1 ($2)"
    printf '%s\t%s\t%s\t%s\n' "$1" 0 0 skipped >>"$WORK/steps.tsv"
}
# step NAME LIMIT_S CMD...: CMD under a time limit of LIMIT_S (stretched by LIMIT_SCALE, for a slow
# machine), cut to what the budget has left once TAIL_S (the run's own ending) and the reserved
# steps' limits are set aside. STEPS, when set, names the steps to run; a step is skipped once under
# STEP_MIN_LEFT_S (15) would be left to it; AFTER_STEP (a command) runs after each. Every step's
# limit, seconds and exit status (or "skipped") go to $WORK/steps.tsv.
step() {
    local name=$1 limit=$2; shift 2
    unreserve "$name"
    _wanted "$name" || return 0
    local left=$((BUDGET_S - ($(date +%s) - START) - ${TAIL_S:-0} - $(_reserved_s)))
    if [ "$left" -lt "${STEP_MIN_LEFT_S:-15}" ]; then
        skip "$name" "budget spent: ${left}s left to it"
        return 1
    fi
    limit=$((limit * ${LIMIT_SCALE:-1}))
    [ "$limit" -gt "$left" ] && limit=$left
    log "start $name (limit ${limit}s)"
    local began=$(date +%s)
    timeout -k 5 "$limit" "$@" >"$WORK/$name.log" 2>&1
    local rc=$?
    log "end $name rc=$rc"
    printf '%s\t%s\t%s\t%s\n' "$name" "$limit" $(($(date +%s) - began)) "$rc" >>"$WORK/steps.tsv"
    grep -v -E "it/s\]|s/it\]|Loading weights" "$WORK/$name.log" | tail -n "${STEP_TAIL_LINES:-15}"
    ${AFTER_STEP:-}
    return $rc
}
