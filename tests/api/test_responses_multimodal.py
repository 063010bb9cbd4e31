"""Images through /v1/responses (input_image parts) on the real server serving a tiny
Qwen2.5-VL: the greedy answer and usage equal chat completions' for the same image and
question, and a chained turn keeps the image in its prompt (the cached prefix covers it)."""
from __future__ import annotations

from helpers.media import media_path

ASK = "What is in this picture?"


def test_input_image_answers_as_chat(vlm_client, vlm_dir):
    model = str(vlm_dir)
    url = media_path("coffee.png").as_uri()
    r = vlm_client.responses.create(model=model, temperature=0, max_output_tokens=8, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": url},
                                     {"type": "input_text", "text": ASK}]}])
    c = vlm_client.chat.completions.create(model=model, temperature=0, max_tokens=8, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                     {"type": "text", "text": ASK}]}])
    assert r.output_text == c.choices[0].message.content
    assert r.usage.input_tokens == c.usage.prompt_tokens
    r2 = vlm_client.responses.create(model=model, temperature=0, max_output_tokens=4,
                                     previous_response_id=r.id, input="And the colour?")
    assert r2.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens - 16
