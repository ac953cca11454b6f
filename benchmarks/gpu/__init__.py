"""The prepared runs on a lent GPU host (gpu_check.sh, suite.sh), each step under its own time limit, and
what they run: greedy parity, the Triton toolchain probe, the summary."""
