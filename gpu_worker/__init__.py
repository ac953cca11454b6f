"""The GPU worker: one model, one paged KV cache, one forward pass per step message.

The only package in the project that imports torch; everything it says crosses Redis as
`common.protocol` messages.
"""
