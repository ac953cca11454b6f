"""CUDA graphs: how a step is captured, decode-only graphs per batch size, and mixed steps in pieces."""
