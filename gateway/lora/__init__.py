"""LoRA adapters' HTTP surface: which ones load (checked against their base model and its workers),
the static ones of the settings, and the runtime load and unload (gateway/api/routes_lora.py)."""
