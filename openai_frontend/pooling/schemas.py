"""Request bodies of the pooling endpoints: OpenAI's `/v1/embeddings`, the Jina / Cohere rerank shape
vLLM serves at `/rerank`, `/v1/rerank` and `/v2/rerank`, vLLM's `/score` pairs and its `/classify`.
Strict as the generation bodies are (openai_frontend/protocol/openai_schemas.py): an unknown field is
a 400."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from openai_frontend.protocol.strings import Id, Text


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EmbeddingRequest(_Strict):
    model: Id | None = None  # must name the served model when given
    input: Text | list[Text] | list[int] | list[list[int]]  # text(s) or token ids, one embedding each
    encoding_format: Literal["float", "base64"] = "float"  # base64: little-endian float32 bytes
    dimensions: int | None = None  # Matryoshka models only: the embedding cut to this many values
    user: Text | None = None
    # vLLM's: keep only the last N tokens of each input (-1: the model's length); else a longer one is a 400.
    truncate_prompt_tokens: int | None = None
    normalize: bool | None = None  # vLLM's: L2-normalize (default: as the model's files say)


class RerankDocument(_Strict):
    text: Text


class RerankRequest(_Strict):
    model: Id | None = None
    query: Text
    documents: list[Text] | list[RerankDocument]  # Cohere v2 also takes {"text": ...} objects
    top_n: int | None = None  # the best n results; none or 0: all
    return_documents: bool = True  # each result repeats its document's text
    truncate_prompt_tokens: int | None = None


class ScoreRequest(_Strict):
    model: Id | None = None
    text_1: Text | list[Text]  # one text against each of text_2, or one list pairwise with it
    text_2: Text | list[Text]
    truncate_prompt_tokens: int | None = None
    user: Text | None = None


class ClassificationRequest(_Strict):
    model: Id | None = None
    input: Text | list[Text] | list[int] | list[list[int]]  # text(s) or token ids, one result each
    truncate_prompt_tokens: int | None = None
    activation: bool | None = None  # vLLM's: the softmax (sigmoid for one label); false: raw logits
    user: Text | None = None
