"""The worker's pieces driven by hand (steps, paged-attention inputs, sampler rows) and a GPU faked on the
CPU: CUDA capture rules, fake cuda tensors, Triton kernels compiled for a GPU target."""
