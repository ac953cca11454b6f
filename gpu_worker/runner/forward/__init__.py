"""The worker's own forward pass for the decoder families it serves (Llama, Mistral, Qwen2, Qwen3).

Built from the transformers model `from_pretrained` loaded (its weights, rotary embedding and
activation), with q/k/v and gate/up merged into one GEMM each, optionally int8/FP8 weights, and
compiled with inductor around paged attention as an opaque custom op (vLLM v1's piecewise design).
Other architectures run transformers' own forward with paged attention plugged in
(gpu_worker/runner/attention/transformers_interface.py).
"""
