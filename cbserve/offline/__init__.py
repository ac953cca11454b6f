"""The engine in one process, no Redis: vLLM's offline `LLM` over the batcher's scheduler and the worker's
model runner (llm.py: the API; engine.py: the step loop; engine_args.py: its arguments as the services'
settings; prompts.py: what it accepts, as token ids; request_state.py: tokens back to text;
outputs.py: what it returns; sampling_params.py: what each request asks for)."""
