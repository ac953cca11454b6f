"""One worker step's parts timed in this process: the forward's variants, a profiled step, decode against
the roofline, the CPU attention and GEMM kernels, the sampler and the draft model."""
