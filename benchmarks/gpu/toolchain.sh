# Sourced by gpu_check.sh (needs PY, WORK and `log`). `probe_toolchain DEVICE` checks what Triton
# needs to build the small C launcher of every kernel on first use: a C compiler (Triton's own
# choice: $CC, else gcc, else clang) and the Python.h of the running interpreter; on cuda it then
# launches one real Triton kernel. If any of that fails, the run goes on without Triton: it exports
# WORKER_ATTENTION_BACKEND=torch (CUDA graphs follow the backend: off) and WORKER_COMPILE=false
# (inductor needs the same compiler), and sets TRITON_OK=0. Writes $WORK/toolchain.json.
probe_toolchain() {
    local device=$1 cc="" include="" problem=""
    if [ -n "${CC:-}" ]; then
        cc=$(command -v "$CC") || problem="CC=$CC is not an executable"
    else
        cc=$(command -v gcc || command -v clang) || problem="no C compiler (gcc or clang; or set CC)"
    fi
    include=$(timeout 30 $PY -c "import sysconfig; print(sysconfig.get_paths()['include'])" 2>/dev/null)
    if [ -z "$problem" ] && [ ! -f "$include/Python.h" ]; then
        problem="no Python.h in ${include:-the include dir of $PY} (install python3-dev)"
    fi
    if [ -z "$problem" ]; then
        printf '#include <Python.h>\nint probe(void) { return Py_IsInitialized(); }\n' >"$WORK/probe.c"
        timeout 60 "$cc" -I"$include" -fPIC -shared "$WORK/probe.c" -o "$WORK/probe.so" \
            >"$WORK/probe-cc.log" 2>&1 || problem="$cc cannot build against Python.h (probe-cc.log)"
    fi
    if [ -z "$problem" ]; then
        local interpret=()
        [ "$device" = cpu ] && interpret=(env TRITON_INTERPRET=1)  # no launcher on cpu: the script only
        "${interpret[@]}" timeout 120 $PY -m benchmarks.gpu.triton_probe --device "$device" \
            >"$WORK/probe-triton.log" 2>&1 || problem="a Triton kernel did not run (probe-triton.log)"
    fi
    if [ -z "$problem" ]; then
        TRITON_OK=1
        log "toolchain: $cc and $include/Python.h build Triton's launcher"
    else
        TRITON_OK=0
        export WORKER_ATTENTION_BACKEND=torch WORKER_COMPILE=false
        log "toolchain: $problem; the run goes on with WORKER_ATTENTION_BACKEND=torch, WORKER_COMPILE=false"
    fi
    $PY -c 'import json, sys; cc, include, problem, ok, backend = sys.argv[1:]; print(json.dumps({
        "c_compiler": cc, "python_include": include, "problem": problem or None, "triton_ok": ok == "1",
        "attention_backend": backend}))' \
        "$cc" "$include" "$problem" "$TRITON_OK" "${WORKER_ATTENTION_BACKEND:-auto}" >"$WORK/toolchain.json"
}
