"""Triton kernels of the paged-attention backend (gpu_worker/runner/attention/triton_attn.py).

They read and write the KV pool in place through slot mappings and block tables. Every kernel loads
its 16-bit inputs and converts them to float32 before any arithmetic: the math is float32 on the GPU
and is the same code Triton's interpreter (`TRITON_INTERPRET=1`, read when a kernel is defined, so set
it before importing these modules) runs on CPU tensors in CI.
"""
