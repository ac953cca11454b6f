"""Talking to Redis, for every service: clients with their timeouts (`redis_conn.py`), a Redis that
refuses writes (`redis_refusal.py`), riding out an outage (`retry.py`), leases (`lease_scripts.py`),
two reads every reader needs (`batcher_liveness.py`, `result_lost.py`), and a chore in a thread
that rides out an outage (`periodic.py`)."""
