"""The systems cbserve is compared with, besides servers given by URL: the static-batching server, our
engine in one process behind the same surface, and llama.cpp's llama-server on the model as GGUF."""
