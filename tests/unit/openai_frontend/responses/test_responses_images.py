"""A Responses input with images: input_image parts become chat's image_url parts in their place
among the text, and a stored turn keeps them, so that the next turn (`previous_response_id`) sends the
model the same conversation."""

from __future__ import annotations

import msgspec

from openai_frontend.protocol.openai_schemas import ContentPart
from openai_frontend.responses.input import input_messages, message_of, turn_of
from openai_frontend.responses.schemas import ResponsesRequest
from openai_frontend.responses.store import Turn

URL = "data:image/png;base64,iVBORw0KGgo="


def test_input_images_are_chat_image_parts_and_survive_the_store() -> None:
    body = ResponsesRequest.model_validate(
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Compare"},
                        {"type": "input_image", "image_url": URL, "detail": "low"},
                        {"type": "input_text", "text": "with this"},
                        {"type": "input_image", "image_url": URL},
                    ],
                }
            ]
        }
    )
    [message] = input_messages(body, [])
    assert message.content == [
        ContentPart(type="text", text="Compare"),
        ContentPart(type="image_url", image_url={"url": URL, "detail": "low"}),
        ContentPart(type="text", text="with this"),
        ContentPart(type="image_url", image_url={"url": URL}),
    ]
    stored = msgspec.msgpack.decode(msgspec.msgpack.encode(turn_of(message)), type=Turn)
    assert stored.content == "Compare\nwith this"
    assert message_of(stored) == message


def test_text_only_turns_are_stored_as_before() -> None:
    [message] = input_messages(ResponsesRequest.model_validate({"input": "Hello"}), [])
    turn = turn_of(message)
    assert turn == Turn("user", "Hello") and turn.parts is None and message_of(turn) == message
