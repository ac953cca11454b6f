"""Talking to Redis, for every service: clients with their timeouts (`redis_conn.py`), a Redis that
refuses writes (`redis_refusal.py`), riding out an outage (`retry.py`), leases (`lease_scripts.py`),
two reads every reader needs (`batcher_liveness.py`, `result_lost.py`), a chore in a thread that
rides out an outage (`periodic.py`), the announcement of a token stream's end (`ended_streams.py`),
and the per-step commands packed by hiredis (`command_packer.py`), sent without redis-py's layers
(`raw_command.py`) and read into tuples (`stream_replies.py`)."""
