"""The batcher as a Redis service around the scheduling core: the busy loop, reading requests and
results (inbox), writing steps and failures (outbox), leadership, recovery, housekeeping, traces."""
