// vlserve's page: ask about pictures or a video, stream the answer, see what the cache did.
// Talks only to the server it came from: /v1/models, /v1/chat/completions (SSE), /metrics.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { messages: [], attachments: [], controller: null };

// ---- API key (kept in this tab's session storage) and requests ------------------------------------
$("api-key").value = sessionStorage.getItem("vlserve-api-key") || "";
$("api-key").addEventListener("change", () => { sessionStorage.setItem("vlserve-api-key", $("api-key").value); loadModels(); });

function headers() {
  const h = { "Content-Type": "application/json" };
  if ($("api-key").value) h["Authorization"] = "Bearer " + $("api-key").value;
  return h;
}

async function errorMessage(response) {
  try { return (await response.json()).error.message; } catch (e) { return `HTTP ${response.status}`; }
}

async function loadModels() {
  const r = await fetch("v1/models", { headers: headers() });
  if (!r.ok) { showError(await errorMessage(r)); return; }
  $("model").replaceChildren(...(await r.json()).data.map((m) => new Option(m.id, m.id)));
}

// ---- attachments: choose, drop, paste ----------------------------------------------------------------
function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function attach(files) {
  for (const file of files) {
    if (!file.type.startsWith("image/") && !file.type.startsWith("video/")) continue;
    state.attachments.push({ kind: file.type.startsWith("video/") ? "video" : "image", url: await readAsDataURL(file) });
  }
  renderThumbs();
}

function renderThumbs() {
  $("thumbs").replaceChildren(...state.attachments.map((a) => {
    if (a.kind === "image") { const img = new Image(); img.src = a.url; img.alt = "attached picture"; return img; }
    const span = document.createElement("span"); span.textContent = "🎞 video "; return span;
  }));
}

$("files").addEventListener("change", (e) => attach(e.target.files));
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => { e.preventDefault(); drop.classList.remove("over"); attach(e.dataTransfer.files); });
document.addEventListener("paste", (e) => { if (e.clipboardData.files.length) attach(e.clipboardData.files); });

// ---- the conversation --------------------------------------------------------------------------------
function addTurn(role, text) {
  const div = document.createElement("div");
  div.className = "turn " + role;
  div.textContent = text;
  $("chat").append(div);
  return div;
}

function showError(message) { addTurn("error", message).setAttribute("role", "alert"); }

function userContent(question) {
  if (!state.attachments.length) return question;
  const parts = state.attachments.map((a) => a.kind === "image"
    ? { type: "image_url", image_url: { url: a.url } } : { type: "video_url", video_url: { url: a.url } });
  return [...parts, { type: "text", text: question }];
}

function requestBody() {
  const body = { model: $("model").value || undefined, messages: state.messages, stream: true,
                 stream_options: { include_usage: true }, max_tokens: Number($("max-tokens").value) || undefined,
                 temperature: Number($("temperature").value) };
  const constraint = $("constraint").value.trim();
  if ($("format").value === "json" && constraint) {
    body.response_format = { type: "json_schema", json_schema: { name: "answer", schema: JSON.parse(constraint) } };
  } else if ($("format").value === "regex" && constraint) {
    body.regex = constraint;
  }
  return body;
}

async function ask(event) {
  event.preventDefault();
  const question = $("question").value.trim();
  if (!question || state.controller) return;
  const userTurn = addTurn("user", question);
  for (const a of state.attachments) if (a.kind === "image") { const img = new Image(); img.src = a.url; img.alt = ""; userTurn.prepend(img); }
  state.messages.push({ role: "user", content: userContent(question) });
  state.attachments = [];  // sent: follow-ups keep them through the conversation's messages
  renderThumbs();
  $("question").value = "";
  let body;
  try { body = requestBody(); } catch (e) { showError("the JSON schema is not valid JSON: " + e.message); state.messages.pop(); return; }
  await stream(body);
}

async function stream(body) {
  const answer = addTurn("assistant", "");
  const text = document.createElement("span");
  answer.append(text);
  state.controller = new AbortController();
  $("send").disabled = true; $("stop").disabled = false;
  const start = performance.now();
  let firstToken = null, usage = null;
  try {
    const r = await fetch("v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body),
                                                   signal: state.controller.signal });
    if (!r.ok) throw new Error(await errorMessage(r));
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      const events = buffer.split("\n\n");
      buffer = events.pop();
      for (const ev of events) {
        const data = ev.replace(/^data: /, "");
        if (!data || data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) usage = chunk.usage;
        const delta = chunk.choices.length ? chunk.choices[0].delta.content : null;
        if (delta) { firstToken = firstToken ?? performance.now(); text.textContent += delta; }
      }
    }
    state.messages.push({ role: "assistant", content: text.textContent });
    answer.append(stats(usage, start, firstToken));
  } catch (e) {
    if (e.name === "AbortError") { answer.append(note("stopped")); state.messages.pop(); }
    else { answer.remove(); state.messages.pop(); showError(e.message); }
  } finally {
    state.controller = null;
    $("send").disabled = false; $("stop").disabled = true;
  }
}

function note(text) { const div = document.createElement("div"); div.className = "stats"; div.textContent = text; return div; }

function stats(usage, start, firstToken) {
  if (!usage) return note("");
  const cached = usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0;
  const end = performance.now();
  const ttft = firstToken ? (firstToken - start) / 1000 : null;
  const rate = firstToken && end > firstToken ? (usage.completion_tokens - 1) / ((end - firstToken) / 1000) : null;
  const div = note(`prompt ${usage.prompt_tokens} tokens · cached ${cached} (${Math.round(100 * cached / usage.prompt_tokens)}%)`
    + (ttft !== null ? ` · first token ${ttft.toFixed(2)} s` : "") + (rate ? ` · ${rate.toFixed(1)} tokens/s` : ""));
  div.dataset.cachedTokens = cached;
  div.dataset.promptTokens = usage.prompt_tokens;
  return div;
}

$("ask").addEventListener("submit", ask);
$("question").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("ask").requestSubmit(); } });
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("clear").addEventListener("click", () => { state.messages = []; state.attachments = []; renderThumbs(); $("chat").replaceChildren(); });

// ---- the live panel from /metrics ----------------------------------------------------------------------
function metric(text, name, label) {
  const re = new RegExp(`^${name}\\{([^}]*)\\} (\\S+)$`, "gm");
  let total = 0;
  for (const m of text.matchAll(re)) if (!label || m[1].includes(label)) total += Number(m[2]);
  return total;
}

async function refreshMetrics() {
  try {
    const r = await fetch("metrics");
    if (!r.ok) return;
    const text = await r.text();
    const capacity = metric(text, "vlserve_kv_pool_capacity_tokens");
    const used = metric(text, "vlserve_kv_pool_tokens", 'state="in_use"');
    const cached = metric(text, "vlserve_kv_pool_tokens", 'state="cached"');
    const prompt = metric(text, "vlserve_prompt_tokens_total"), hits = metric(text, "vlserve_cached_prompt_tokens_total");
    $("m-pool").textContent = `${used} used · ${cached} cached · ${capacity - used - cached} free`;
    $("m-hit").textContent = prompt ? `${(100 * hits / prompt).toFixed(1)}%` : "–";
    $("m-requests").textContent = `${metric(text, "vlserve_num_running_requests")} running · `
      + `${metric(text, "vlserve_num_waiting_requests")} waiting`;
  } catch (e) { /* the panel is best effort */ }
}

loadModels();
refreshMetrics();
setInterval(refreshMetrics, 2000);
