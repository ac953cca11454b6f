"""The batcher's scheduling core: which requests run where, in which step, with which KV blocks.

Pure and synchronous: no Redis, no clock of its own, no I/O (tests/unit/test_import_rules.py), so the
Redis service (batcher/service/) and an in-process engine drive the same `Scheduler`.
"""
