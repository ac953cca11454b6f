"""Whether one more request may be taken now: its cell has a live batcher and Redis headroom
(`cell_guard.py`, `redis_memory.py`), its queue has room (`queue_bound.py`), its caller is within
the rate limits (`rate_limit.py`). The app's state holds one of each; generation asks them."""
