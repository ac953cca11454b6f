"""LoRA adapters on the worker, unmerged: the base weights never change, each adapted linear adds
`scale * (x A^T) B^T` to the rows of its adapter's tokens, for every adapter of a step in one grouped
operation per linear (layers.py: the stacked slots; step.py: the per-forward token-to-slot tensors and
the grouped matmul; triton_op.py: the CUDA kernels as one opaque op; weights.py: an adapter's factors
read into host memory; manager.py: which adapters are in host memory and which in the step's slots)."""
