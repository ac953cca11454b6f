"""vLLM's tokenizer endpoints over real HTTP: /tokenize counts what a generation request would queue,
/detokenize gives the text back, /tokenizer_info tells a remote tokenizer client what it needs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tokenizers import Tokenizer

from harness.gateway.gateway_server import RunningGateway
from openai_frontend.model.chatml import EOS, IM_START

MESSAGES = [{"role": "user", "content": "What is the assert statement?"}]


def test_tokenize_a_prompt_as_a_completion_would(gateway: RunningGateway, tiny_model_dir: Path) -> None:
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    answer = gateway.client.post("/tokenize", json={"prompt": "Return the value", "return_token_strs": True})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    ids = tok.encode("Return the value").ids
    assert body == {
        "count": len(ids),
        "max_model_len": gateway.app.state.gateway.models.default.rules.max_model_len,
        "tokens": ids,
        "token_strs": [tok.id_to_token(t) for t in ids],
    }
    assert gateway.client.post("/detokenize", json={"tokens": ids}).json() == {"prompt": "Return the value"}
    # Special tokens come back as text, as vLLM's /detokenize gives them.
    special = [tok.token_to_id(IM_START), *ids]
    assert (
        gateway.client.post("/detokenize", json={"tokens": special}).json()["prompt"]
        == IM_START + "Return the value"
    )


def test_tokenize_messages_counts_what_a_chat_request_queues(gateway: RunningGateway) -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        body = {"messages": MESSAGES, "max_tokens": 1}
        future = pool.submit(gateway.client.post, "/v1/chat/completions", json=body)
        queued = gateway.harness.next_request()
        gateway.harness.emit_tokens(queued.req_id, [300])
        assert future.result(timeout=30).status_code == 200
    tokenized = gateway.client.post("/tokenize", json={"messages": MESSAGES}).json()
    assert tokenized["tokens"] == queued.prompt_token_ids and tokenized["token_strs"] is None
    without = gateway.client.post(
        "/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}
    ).json()
    assert without["count"] < tokenized["count"]


def test_tokenizer_info_and_refusals(gateway: RunningGateway) -> None:
    info = gateway.client.get("/tokenizer_info").json()
    assert info["eos_token"] == EOS and "<|im_start|>" in info["chat_template"]
    assert info["model_max_length"] == gateway.app.state.gateway.models.default.rules.max_model_len
    out_of_vocab = gateway.client.post("/detokenize", json={"tokens": [10**6]})
    assert out_of_vocab.status_code == 400 and out_of_vocab.json()["error"]["param"] == "tokens"
    unknown = gateway.client.post("/tokenize", json={"prompt": "hi", "truncate": True})
    assert unknown.status_code == 400 and "truncate" in unknown.json()["error"]["message"]
    wrong_model = gateway.client.post("/tokenize", json={"prompt": "hi", "model": "other"})
    assert wrong_model.status_code == 404
