# Sourced by suite.sh and gpu_check.sh (needs PY and PROFILE): a GPU host without a package registry
# gets the missing wheels and redis-server carried in .whl/ (benchmarks/gpu_wheels.sh fills it).
if [ "$PROFILE" = gpu ] && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
[ -d .whl/bin ] && chmod +x .whl/bin/* && export PATH=$PWD/.whl/bin:$PATH
