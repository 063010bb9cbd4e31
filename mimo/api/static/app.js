// mimo's chat page: plain browser JavaScript, no build step, nothing fetched from elsewhere.
// Talks to this server's OpenAI API: /v1/models for the picker, /v1/chat/completions (or
// /v1/completions in text-completion mode, for base models) streamed as server-sent events.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "mimo.apiKey";
const history = [];          // the conversation as OpenAI messages (chat mode)
let image = null;            // the attached image as a data: URL
let controller = null;       // AbortController of the answer being streamed

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").classList.toggle("error", !!isError);
}

// One message bubble; text goes in with textContent only (model output is never HTML).
function bubble(role, text, imageUrl) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  if (imageUrl) {
    const img = document.createElement("img");
    img.src = imageUrl;
    img.alt = "attached image";
    div.appendChild(img);
  }
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  div.appendChild(body);
  const stats = document.createElement("div");
  stats.className = "stats";
  div.appendChild(stats);
  $("log").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

// An error body in OpenAI's shape ({"error": {"message", "type", "param", "code"}}) or text.
async function errorText(resp) {
  const raw = await resp.text();
  try {
    const e = JSON.parse(raw).error;
    return `Error ${resp.status}: ${e.message}` + (e.param ? ` (parameter: ${e.param})` : "");
  } catch (_) {
    return `Error ${resp.status}: ${raw || resp.statusText}`;
  }
}

async function loadModels() {
  const sel = $("model");
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    if (!resp.ok) {
      const needsKey = resp.status === 401;
      if (needsKey) $("settings").open = true;
      setStatus(await errorText(resp) + (needsKey ? " - enter the API key in Settings" : ""), true);
      return;
    }
    const models = (await resp.json()).data;
    const previous = sel.value;
    sel.replaceChildren(...models.map((m) => new Option(m.id, m.id)));
    if (models.some((m) => m.id === previous)) sel.value = previous;
    setStatus(`${models.length} model(s) served`);
  } catch (e) {
    setStatus("Cannot reach the server: " + e.message, true);
  }
}

// Read a server-sent-event stream; calls onData with each parsed `data:` payload.
async function readEvents(resp, onData) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }
}

function statsText(t) {
  const parts = [];
  const u = t.usage;
  const n = u ? u.completion_tokens : t.chunks;
  const decodeS = (t.last - t.first) / 1000;
  if (t.first) {
    parts.push(`${n} token${n === 1 ? "" : "s"}${u ? "" : " (approx.)"}`);
    if (n > 1 && decodeS > 0) parts.push(`${((n - 1) / decodeS).toFixed(1)} tokens/s`);
    parts.push(`first token ${((t.first - t.start) / 1000).toFixed(2)} s`);
  }
  if (u) {
    const cached = (u.prompt_tokens_details || {}).cached_tokens || 0;
    parts.push(`cached_tokens ${cached} of ${u.prompt_tokens} prompt tokens`);
  }
  if (t.stopped) parts.push("stopped");
  return parts.join(" · ");
}

function requestBody(mode, text) {
  const body = {
    model: $("model").value,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: parseInt($("max-tokens").value, 10) || 256,
    temperature: parseFloat($("temperature").value),
  };
  if (Number.isNaN(body.temperature)) delete body.temperature;
  if (mode === "completion") {
    body.prompt = text;
  } else {
    const content = image
      ? [{ type: "text", text }, { type: "image_url", image_url: { url: image } }]
      : text;
    body.messages = history.concat([{ role: "user", content }]);
  }
  return body;
}

async function send(ev) {
  ev.preventDefault();
  const text = $("prompt").value;
  const mode = $("mode").value;
  if (controller || (!text.trim() && !image)) return;
  if (mode === "completion" && image) {
    setStatus("Text completion takes no image: switch to chat or remove it", true);
    return;
  }
  const body = requestBody(mode, text);
  bubble("user", text, mode === "chat" ? image : null);
  const answer = bubble("assistant", "");
  const out = answer.querySelector(".text");
  const t = { start: performance.now(), first: 0, last: 0, chunks: 0, usage: null };
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  $("prompt").value = "";
  clearImage();
  setStatus("Generating...");
  const url = mode === "completion" ? "/v1/completions" : "/v1/chat/completions";
  try {
    const resp = await fetch(url, { method: "POST", headers: headers(), body: JSON.stringify(body),
                                    signal: controller.signal });
    if (!resp.ok) throw new Error(await errorText(resp));
    await readEvents(resp, (chunk) => {
      if (chunk.error) throw new Error(`Error: ${chunk.error.message}`);
      if (chunk.usage) t.usage = chunk.usage;
      const c = (chunk.choices || [])[0];
      if (!c) return;
      const piece = mode === "completion" ? c.text : (c.delta || {}).content;
      if (piece) {
        t.last = performance.now();
        if (!t.first) t.first = t.last;
        t.chunks += 1;
        out.textContent += piece;
        answer.scrollIntoView({ block: "end" });
      }
    });
    if (mode === "chat") history.push(body.messages.at(-1), { role: "assistant", content: out.textContent });
    setStatus("Done");
  } catch (e) {
    if (e.name === "AbortError") {
      t.stopped = true;
      if (mode === "chat") history.push(body.messages.at(-1), { role: "assistant", content: out.textContent });
      setStatus("Stopped");
    } else {
      answer.classList.add("error");
      out.textContent = out.textContent ? out.textContent + "\n" + e.message : e.message;
      setStatus(e.message, true);
    }
  } finally {
    answer.querySelector(".stats").textContent = statsText(t);
    answer.dataset.done = "1";          // the answer has ended (tests wait on it)
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

function clearImage() {
  image = null;
  $("image").value = "";
  $("attachment").hidden = true;
  $("preview").removeAttribute("src");
}

function attach() {
  const file = $("image").files[0];
  if (!file) return;
  const reader = new FileReader();
  reader.onload = () => {
    image = reader.result;
    $("preview").src = image;
    $("attachment").hidden = false;
  };
  reader.onerror = () => setStatus("Cannot read " + file.name, true);
  reader.readAsDataURL(file);
}

function init() {
  $("api-key").value = localStorage.getItem(KEY_STORE) || "";
  $("api-key").addEventListener("change", () => {
    localStorage.setItem(KEY_STORE, $("api-key").value.trim());
    loadModels();
  });
  $("composer").addEventListener("submit", send);
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("image").addEventListener("change", attach);
  $("detach").addEventListener("click", clearImage);
  $("clear").addEventListener("click", () => {
    history.length = 0;
    $("log").replaceChildren();
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  loadModels();
}

init();
