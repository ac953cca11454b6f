"""Pooling endpoints' bodies to prompts and results to answers: OpenAI's input forms and encodings,
the rerank order and its options, and refusals by field."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import pytest

from common.protocol import PoolingEvent
from openai_frontend.model.served_model import ServedModel
from openai_frontend.pooling import bodies
from openai_frontend.pooling.schemas import ClassificationRequest, EmbeddingRequest, RerankRequest
from openai_frontend.protocol.errors import OpenAIError


def event(*values: float, num_prompt_tokens: int = 3) -> PoolingEvent:
    data = struct.pack(f"<{len(values)}f", *values)
    return PoolingEvent(req_id="r", attempt=1, data=data, num_prompt_tokens=num_prompt_tokens)


def test_every_input_form_is_one_prompt_each(tiny_served: ServedModel) -> None:
    text = tiny_served.tokenizer.encode("hello world", add_special_tokens=True)
    forms = {
        "hello world": [text],
        ("hello world", "hello world"): [text, text],
        (5, 6, 7): [[5, 6, 7]],
        ((5, 6), (7,)): [[5, 6], [7]],
    }
    for given, prompts in forms.items():
        body = EmbeddingRequest.model_validate({"input": _json(given)})
        job = bodies.embedding_job(body, tiny_served)
        assert [ids for ids, _ in job.prompts] == prompts
    body = EmbeddingRequest(input="a", dimensions=8, truncate_prompt_tokens=4, normalize=False)
    params = bodies.embedding_job(body, tiny_served).params
    assert (params.task, params.dimensions, params.truncate_prompt_tokens, params.normalize) == (
        "embed",
        8,
        4,
        False,
    )


def test_refusals_name_the_field(tiny_served: ServedModel) -> None:
    for body, param in (
        (EmbeddingRequest(input=[]), "input"),
        (EmbeddingRequest.model_validate({"input": [[]]}), "input"),
        (EmbeddingRequest(input=[10**9]), "input"),
        (EmbeddingRequest(input="a", dimensions=0), "dimensions"),
    ):
        with pytest.raises(OpenAIError) as refused:
            bodies.embedding_job(body, tiny_served)
        assert (refused.value.status, refused.value.param) == (400, param)
    with pytest.raises(OpenAIError) as refused:
        bodies.embedding_job(EmbeddingRequest(input="a", model="other"), tiny_served)
    assert refused.value.status == 404
    with pytest.raises(OpenAIError, match="documents must not be empty"):
        bodies.rerank_texts(RerankRequest(query="q", documents=[]), tiny_served)
    with pytest.raises(OpenAIError, match="one text against a list"):
        bodies.pair_job(["a", "b"], ["c"], tiny_served, "score", None)


def test_embeddings_as_floats_or_base64_of_float32_bytes() -> None:
    events = [event(0.5, -1.0), event(2.0, 0.25, num_prompt_tokens=4)]
    floats = bodies.embedding_answer(events, "float", "m")
    assert [d["embedding"] for d in floats["data"]] == [[0.5, -1.0], [2.0, 0.25]]
    assert floats["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    encoded = bodies.embedding_answer(events, "base64", "m")["data"][1]["embedding"]
    assert struct.unpack("<2f", base64.b64decode(encoded)) == (2.0, 0.25)


def test_rerank_sorts_cuts_at_top_n_and_may_leave_the_documents_out() -> None:
    texts = ["a", "b", "c"]
    body = RerankRequest(query="q", documents=texts, top_n=2, return_documents=False)
    answer = bodies.rerank_answer("r", texts, [0.1, 0.9, 0.5], body, "m", 12)
    assert [(r["index"], r["relevance_score"], r["document"]) for r in answer["results"]] == [
        (1, 0.9, None),
        (2, 0.5, None),
    ]
    everything = bodies.rerank_answer(
        "r", texts, [0.1, 0.9, 0.5], RerankRequest(query="q", documents=texts), "m", 12
    )
    assert [r["document"]["text"] for r in everything["results"]] == ["b", "c", "a"]


def test_an_embedding_models_scores_are_cosines_one_against_all_or_pairwise() -> None:
    one_against_two = [event(1.0, 0.0), event(1.0, 0.0), event(0.0, 1.0)]
    assert bodies.scores(one_against_two, "embed", 1) == pytest.approx([1.0, 0.0])
    pairwise = [event(1.0, 0.0), event(0.0, 1.0), event(0.0, 1.0), event(0.0, 1.0)]
    assert bodies.scores(pairwise, "embed", 2) == pytest.approx([0.0, 1.0])
    assert bodies.scores([event(0.75)], "score", 1) == [0.75]
    answer = bodies.score_answer("r", 5, [0.75], "m", 3)
    assert answer["data"] == [{"index": 0, "object": "score", "score": 0.75}]


def test_classify_reads_texts_with_special_tokens_and_names_the_likeliest_label(
    tiny_served: ServedModel, tmp_path: Path
) -> None:
    body = ClassificationRequest(input=["hello world", "hi"], activation=False, truncate_prompt_tokens=8)
    job = bodies.classification_job(body, tiny_served)
    expected = [tiny_served.tokenizer.encode(t, add_special_tokens=True) for t in ("hello world", "hi")]
    assert [ids for ids, _ in job.prompts] == expected
    params = job.params
    assert (params.task, params.activation, params.truncate_prompt_tokens) == ("classify", False, 8)
    (tmp_path / "config.json").write_text(json.dumps({"id2label": {"0": "neg", "1": "pos"}}))
    events = [event(0.2, 0.8, num_prompt_tokens=2), event(0.9, 0.1, num_prompt_tokens=5)]
    answer = bodies.classification_answer("r", 7, events, "m", tmp_path)
    assert {k: answer[k] for k in ("id", "object", "created", "model")} == {
        "id": "classify-r",
        "object": "list",
        "created": 7,
        "model": "m",
    }
    labels = [(d["index"], d["label"], d["num_classes"]) for d in answer["data"]]
    assert labels == [(0, "pos", 2), (1, "neg", 2)]
    assert answer["data"][0]["probs"] == pytest.approx([0.2, 0.8])
    assert answer["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    unnamed = bodies.classification_answer("r", 7, [event(0.1, 0.2, 0.7)], "m", tmp_path / "elsewhere")
    assert unnamed["data"][0]["label"] == "LABEL_2"  # transformers' name for a label saved without one


def _json(given: object) -> object:
    return list(map(_json, given)) if isinstance(given, tuple) else given
