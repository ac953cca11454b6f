"""Serving benchmarks: a load generator for OpenAI-compatible servers and the baselines it compares.

- `python -m benchmarks.serve`: one system (`--base-url`) or `compare` several on one request list.
- `python -m benchmarks.baselines.static_server`: the static-batching baseline over the same HTTP surface.
- `python -m benchmarks.workloads.make_model`: the random-weight benchmark model directories.

Only `static_server`'s engine and `make_model` import torch; the load generator never does.
"""
