# One image for every Python service; docker-compose.yml picks the module to run.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# A C++ compiler (and ninja, which torch's extension builder drives): the worker compiles its forward
# at startup (inductor's C++ kernels and gpu_worker/kernels/cpu/ on the CPU, Triton's launcher on
# CUDA); without one it runs eagerly and gathers K/V for decode attention, with a warning. Its cache
# lives in the container's ~/.cache, so a restarted container loads its builds instead of compiling.
RUN apt-get update && apt-get install -y --no-install-recommends g++ ninja-build && rm -rf /var/lib/apt/lists/*

# torch first and on its own layer: it is the big one, and its build (CUDA on PyPI's Linux wheel)
# is chosen here rather than by a dependency resolver.
RUN pip install torch==2.13.0

COPY pyproject.toml README.md ./
COPY common ./common
COPY openai_frontend ./openai_frontend
COPY gateway ./gateway
COPY batcher ./batcher
COPY gpu_worker ./gpu_worker
COPY cbserve ./cbserve
COPY cbserve_celery ./cbserve_celery
RUN pip install ".[worker,gateway,celery]"

# Models are mounted at /models (see docker-compose.yml); nothing is fetched at run time.
RUN useradd --create-home --uid 1000 app
USER app
