"""Build the CPU kernels now (`python -m gpu_worker.kernels.cpu`) instead of at a worker's first start."""

import sys

from gpu_worker.kernels import cpu as cpu_kernels

if __name__ == "__main__":
    built = cpu_kernels.load()
    print("cbserve CPU kernels:", "built" if built else "unavailable (see the warning above)")
    sys.exit(0 if built else 1)
