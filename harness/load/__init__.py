"""Load and fault runs: the HTTP clients, sustained load, faults fired mid-stream, Batch API runs, a
Cluster failover, the disconnect probe, and what requests leave behind."""
