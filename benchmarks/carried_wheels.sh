# Sourced by suite.sh and gpu_check.sh (needs PY and PROFILE): a GPU host without a package registry
# gets the missing wheels and redis-server carried in .whl/ (benchmarks/gpu_wheels.sh fills it).
# A wheel that does not install (another Python's, a truncated copy) is named and left out, never the
# end of the run: the steps that need it fail on their own and the others still report. Then every
# module the steps import is tried, and the missing ones are named up front.
if [ "$PROFILE" = gpu ] && ls .whl/*.whl >/dev/null 2>&1; then
    pip_target=(-m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site)
    if ! timeout 180 $PY "${pip_target[@]}" .whl/*.whl; then
        for wheel in .whl/*.whl; do
            timeout 60 $PY "${pip_target[@]}" "$wheel" ||
                echo "carried_wheels.sh: $wheel did not install; the steps that need it will fail" >&2
        done
    fi
    export PYTHONPATH=/tmp/site:$PWD
fi
[ -d .whl/bin ] && chmod +x .whl/bin/* && export PATH=$PWD/.whl/bin:$PATH
missing_modules=$($PY - <<'PY' 2>&1
import importlib
for name in ("torch", "transformers", "tokenizers", "safetensors", "msgspec", "redis", "pydantic_settings",
             "fastapi", "uvicorn", "httpx", "aiohttp", "numpy", "tqdm", "pytest", "pluggy", "iniconfig"):
    try:
        importlib.import_module(name)
    except Exception as exc:  # any failure to import is worth naming here
        print(f"{name} ({type(exc).__name__})", end=" ")
PY
)
[ -n "$missing_modules" ] && echo "carried_wheels.sh: cannot import: $missing_modules" >&2
command -v redis-server >/dev/null || echo "carried_wheels.sh: no redis-server on PATH (the e2e steps need it)" >&2
true
