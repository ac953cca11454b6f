"""Hand-written kernels the runner's attention and linear layers call: Triton (GPU) and C++ (CPU)."""
