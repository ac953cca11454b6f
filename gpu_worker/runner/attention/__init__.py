"""Paged attention: the backend interface, the backend the settings select (torch, triton), layer
variants, cascade attention, and the glue that plugs it into transformers' models."""
