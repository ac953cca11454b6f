"""LoRA adapters without torch, for the gateway and the worker: a PEFT adapter read and checked against
its base model (`lora_adapter.py`, over `safetensors_header.py`) and vLLM's `--lora-modules`
(`lora_modules.py`)."""
