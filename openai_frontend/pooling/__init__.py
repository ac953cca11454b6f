"""Pooling requests from the front end's side (embeddings, classification, scores): the prompts and
pairs they carry, as token ids, shared by the offline `LLM` and the gateway."""
