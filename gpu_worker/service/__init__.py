"""The worker service around the runner: the Redis loop, fenced writes, publishing and heartbeat."""
