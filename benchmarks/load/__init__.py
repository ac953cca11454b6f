"""The load generator's parts (benchmarks/serve.py is its CLI, after `vllm bench serve`): a request
list sent on its schedule to one server, each request timed, and the systems `compare` starts and stops."""
