"""One worker's KV blocks as the scheduler sees them: the pool, the prefix cache, and the manager
through which requests get and give back their blocks."""
