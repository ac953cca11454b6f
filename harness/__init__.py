"""What the tests, benchmarks and scripts share to measure the real thing: Redis and the services
started on free ports, tiny models built from transformers' own classes, load and fault clients. Not
part of the wheel; run from the repository root (`python -m scripts.soak`, `python -m pytest`)."""
