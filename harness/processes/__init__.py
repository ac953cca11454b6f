"""Real processes on free ports: a test's own redis-server (restartable, or a Cluster), the services
(batcher, workers, gateway), and a whole private stack for the load scripts."""
