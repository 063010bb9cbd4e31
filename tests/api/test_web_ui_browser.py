"""The chat page at / driven in headless Chromium (the distribution's package) by Playwright,
against real servers: a streamed chat whose text must equal the server's own non-streamed
answer, the API key typed into the page, cached_tokens of a second turn, an image sent to a
tiny vision-language model (the prompt it reports counts the image's tokens), the 400 a
text-only model gives for an image shown in the page, and Stop mid-stream, after which the
server has freed the request (pools idle, counted as aborted by its client).
Skipped only when no Chromium executable is found. (Waits go through locators, not
wait_for_function: the page's Content-Security-Policy forbids the eval that one needs.)"""
from __future__ import annotations

import base64
import os
import re
import shutil
import time
import uuid

import httpx
import pytest
from helpers.api_server import API_KEY, KEY_HEADER
from playwright.sync_api import expect

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _browser_path() -> str | None:
    env = os.environ.get("MIMO_CHROMIUM")
    if env:
        return env
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


# Decided at collection, so that no server starts for a test that cannot run.
pytestmark = pytest.mark.skipif(
    _browser_path() is None, reason="no Chromium found (tried $MIMO_CHROMIUM and " +
    ", ".join(BROWSERS) + " on PATH): apt-get install chromium")


@pytest.fixture(scope="module")
def browser():
    path = _browser_path()
    from playwright.sync_api import sync_playwright
    expect.set_options(timeout=60_000)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 390, "height": 844})   # a phone's width
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    yield pg
    ctx.close()


def _open(page, url: str, key: str | None = None, temperature: str = "0") -> None:
    page.goto(url + "/")
    if key is not None:   # without it /v1/models is refused, and the page says so
        expect(page.locator("#status")).to_contain_text("Error 401")
        assert page.locator("#settings").get_attribute("open") is not None
        page.fill("#api-key", key)
        page.dispatch_event("#api-key", "change")
    page.locator("#model option").first.wait_for(state="attached")
    if page.locator("#settings").get_attribute("open") is None:
        page.click("#settings summary")
    page.fill("#temperature", temperature)


def _ask(page, text: str, max_tokens: int) -> tuple[str, str, bool]:
    """Send one message; wait for its answer to end. Returns (text, stats, is_error)."""
    page.fill("#max-tokens", str(max_tokens))
    n = page.locator(".msg.assistant").count()
    page.fill("#prompt", text)
    page.click("#send")
    answer = page.locator(".msg.assistant").nth(n)
    expect(answer).to_have_attribute("data-done", "1")
    return (answer.locator(".text").text_content() or "",
            answer.locator(".stats").text_content() or "",
            "error" in (answer.get_attribute("class") or ""))


def _direct(url: str, messages: list, max_tokens: int, model: str, headers=None) -> dict:
    """The server's own greedy answer. A fresh cache_salt keeps it off the prefix the page's
    request cached: its whole prompt is prefilled, as the page's was (a cached prompt's last
    token would run as a decode step, on the quantized kernels, with other rounding)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "cache_salt": uuid.uuid4().hex}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers,
                      timeout=120).json()


def _cached(stats: str) -> tuple[int, int]:
    m = re.search(r"cached_tokens (\d+) of (\d+) prompt tokens", stats)
    assert m, stats
    return int(m.group(1)), int(m.group(2))


def test_chat_streams_the_servers_answer_and_shows_cached_tokens(page, server):
    _open(page, server.url, key=API_KEY)
    model = page.locator("#model").input_value()
    text, stats, err = _ask(page, "Hello! Tell me about the sea.", 24)
    assert not err, text
    want = _direct(server.url, [{"role": "user", "content": "Hello! Tell me about the sea."}],
                   24, model, KEY_HEADER)
    assert text == want["choices"][0]["message"]["content"]
    assert re.search(r"\d+ tokens · [\d.]+ tokens/s", stats), stats
    assert _cached(stats)[1] == want["usage"]["prompt_tokens"]
    # Usable at a phone's width: every control lies inside the 390 px viewport.
    for sel in ("#model", "#mode", "#prompt", ".file", "#send", "#stop", ".msg.user"):
        box = page.locator(sel).first.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, (sel, box)
    # The second turn's prompt starts with the first turn: the prefix cache serves it.
    text2, stats2, err2 = _ask(page, "And about rivers?", 8)
    assert not err2, text2
    cached, prompt = _cached(stats2)
    assert 0 < cached < prompt
    server.assert_pools_idle()


def test_image_to_text_only_model_shows_the_servers_400(page, server, media_dir):
    _open(page, server.url, key=API_KEY)
    page.set_input_files("#image", str(media_dir / "coffee.png"))
    page.locator("#attachment:not([hidden])").wait_for()
    text, _, err = _ask(page, "What is this?", 8)
    assert err
    assert text.startswith("Error 400: ") and "image" in text, text
    assert "Error 400" in (page.text_content("#status") or "")
    # The refused turn stays out of the conversation: the next message is answered.
    text, _, err = _ask(page, "Hello!", 4)
    assert not err, text


def test_image_reaches_the_vision_model(page, vlm_server, media_dir):
    _open(page, vlm_server.url)
    model = page.locator("#model").input_value()
    png = media_dir / "astronaut.png"
    page.set_input_files("#image", str(png))
    page.locator("#attachment:not([hidden])").wait_for()
    text, stats, err = _ask(page, "Describe the picture.", 6)
    assert not err, text
    assert page.locator(".msg.user img").get_attribute("src").startswith("data:image/png;base64,")
    url = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    with_image = _direct(vlm_server.url, [{"role": "user", "content": [
        {"type": "text", "text": "Describe the picture."},
        {"type": "image_url", "image_url": {"url": url}}]}], 6, model)
    text_only = _direct(vlm_server.url, [{"role": "user", "content": "Describe the picture."}],
                        6, model)
    assert text == with_image["choices"][0]["message"]["content"]
    prompt = _cached(stats)[1]
    assert prompt == with_image["usage"]["prompt_tokens"] > text_only["usage"]["prompt_tokens"]
    vlm_server.assert_pools_idle()


def _aborted(server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10, headers=KEY_HEADER).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("mimo_requests_aborted_total"))


def test_stop_mid_stream_frees_the_request(page, server):
    _open(page, server.url, key=API_KEY)
    server.assert_pools_idle()
    aborted0 = _aborted(server)
    page.fill("#max-tokens", "3000")      # minutes of decoding: only Stop can end it soon
    page.fill("#prompt", "Write a very long story about a lighthouse keeper.")
    page.click("#send")
    answer = page.locator(".msg.assistant").last
    # The answer streams in while the request runs: text shows and Stop is still enabled.
    expect(answer.locator(".text")).to_have_text(re.compile(r".{20}", re.S))
    assert page.locator("#stop").is_enabled()
    assert answer.locator(".stats").text_content() == ""
    page.click("#stop")
    expect(answer).to_have_attribute("data-done", "1")
    assert "stopped" in (answer.locator(".stats").text_content() or "")
    assert page.text_content("#status") == "Stopped"
    assert page.locator("#send").is_enabled() and not page.locator("#stop").is_enabled()
    server.assert_pools_idle(timeout=10)
    deadline = time.time() + 5
    while _aborted(server) < aborted0 + 1 and time.time() < deadline:
        time.sleep(0.05)
    assert _aborted(server) == aborted0 + 1
