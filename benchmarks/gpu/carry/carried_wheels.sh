# Sourced by suite.sh and gpu_check.sh (needs PY and PROFILE); returns 1 when the run cannot go on.
# A GPU host without a package registry gets the wheels of benchmarks/gpu/carry/gpu_carry.lock.json (what it
# lacks, resolved against its own packages by benchmarks/gpu/carry/carry_resolve.py) and redis-server carried in
# .whl/ (benchmarks/gpu/carry/gpu_wheels.sh fills it): they are installed into /tmp/site, first on PYTHONPATH, and
# a wheel that does not install ends the run. Then benchmarks/gpu/carry/carry_verify.py checks the host's
# versions against the lock and imports every module the steps import: the first that fails is named
# and ends the run, before any step spends the budget.
if [ "$PROFILE" = gpu ] && ls .whl/*.whl >/dev/null 2>&1; then
    if ! timeout 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl; then
        echo "carried_wheels.sh: cannot install the carried wheels (pip names the one above)" >&2
        return 1
    fi
    export PYTHONPATH=/tmp/site:$PWD
    carried=(--carried)
fi
[ -d .whl/bin ] && chmod +x .whl/bin/* && export PATH=$PWD/.whl/bin:$PATH
timeout 120 $PY -m benchmarks.gpu.carry.carry_verify ${carried[@]+"${carried[@]}"} || return 1
command -v redis-server >/dev/null || echo "carried_wheels.sh: no redis-server on PATH (the e2e steps need it)" >&2
true
