"""Pooling models (vLLM's `--runner pooling`): embeddings, classification and scores instead of
sampled tokens. model_files.py reads what the model is from its own files; causal_runner.py (with
causal_model.py) serves causal LMs on the generating runner's KV cache; encoder_runner.py serves
bidirectional encoders; pooled_output.py turns pooled states into a request's `PoolingEvent`."""
