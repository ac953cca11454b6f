"""Real processes on free ports: a test's own redis-server (restartable, or a Cluster), the services
(batcher, workers, gateway), a whole private stack for the load scripts, and code run in a fresh
interpreter (which heavy libraries it loads)."""
