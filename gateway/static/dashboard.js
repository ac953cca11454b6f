// cbserve dashboard: a playground that streams a chat completion, and a live picture of continuous
// batching drawn from the batcher's per-step trace (GET /v1/dashboard/events).
// Plain JS, no build step, nothing loaded from elsewhere. Every call goes through fetch() with an
// Authorization header when a key is set: EventSource cannot send headers, so SSE is parsed by hand.
"use strict";

const WINDOW_STEPS = 100; // steps kept per worker: the columns of its grid
const RATE_WINDOW_S = 5; // tokens/s are averaged over this much of the server's time
const GONE_AFTER_S = 10; // a worker missing from the batcher's snapshot and silent this long is dropped
const KEY_STORAGE = "cbserve.apiKey"; // sessionStorage: forgotten when the tab closes
const KIND_NAMES = { p: "prefill", d: "decode", w: "idle" };

const $ = (testid) => document.querySelector(`[data-testid="${testid}"]`);

const state = {
  key: sessionStorage.getItem(KEY_STORAGE) || "",
  workers: new Map(), // worker id -> Worker
  clockOffset: 0, // server unix time minus Date.now() / 1000, from the last stats event
  waiting: { value: 0, at: 0 }, // queue depth and the server time it was true at
  mine: null, // short id of the playground's request
  paused: false,
  renderTimer: 0,
  events: null, // AbortController of the events connection
  play: null, // AbortController of the playground's request
  model: "", // the base model shown and prompted (with several); "" the server's default
};

// ----- helpers --------------------------------------------------------------------------------

function authHeaders() {
  return state.key ? { Authorization: `Bearer ${state.key}` } : {};
}

function serverNow() {
  return Date.now() / 1000 + state.clockOffset;
}

function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

// A stable, well-spread hue per request id (golden-angle steps over a string hash).
function hue(id) {
  let h = 0;
  for (const c of id) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return Math.round((h * 137.508) % 360);
}

// Keep the newest of two sources (a step and the once-a-second stats) by the server time they describe.
function setIfNewer(slot, value, at) {
  if (at >= slot.at) {
    slot.value = value;
    slot.at = at;
  }
}

function fmtRate(x) {
  return x >= 100 ? Math.round(x).toString() : x.toFixed(1);
}

async function errorMessage(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) return `${resp.status}: ${body.error.message}`;
  } catch (_) {
    /* not JSON */
  }
  return `HTTP ${resp.status}`;
}

// Server-sent events from a fetch() body: yields {event, id, data} per event.
async function* sseEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const event = { event: "message", id: null, data: [] };
        for (const line of block.split("\n")) {
          if (!line || line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? "" : line.slice(colon + 1);
          if (value.startsWith(" ")) value = value.slice(1);
          if (field === "data") event.data.push(value);
          else if (field === "event") event.event = value;
          else if (field === "id") event.id = value;
        }
        if (event.data.length) yield { event: event.event, id: event.id, data: event.data.join("\n") };
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// ----- the batch model --------------------------------------------------------------------------

function workerState(id) {
  let w = state.workers.get(id);
  if (!w) {
    w = {
      id,
      steps: [], // the last WINDOW_STEPS steps: {step, time, cells, tokens, prefill}
      rates: [], // [time, computed tokens, sampled tokens] of the steps in the rate window
      slots: new Map(), // request id -> its row, from joining the batch to leaving it
      lastStepId: -1,
      lastStepAt: 0,
      kv: { value: { used: 0, cached: 0, total: 0 }, at: 0 },
      running: { value: 0, at: 0 },
      el: null,
    };
    state.workers.set(id, w);
  }
  return w;
}

function onStep(t) {
  const w = workerState(t.worker_id);
  if (t.step_id <= w.lastStepId) return; // seen already (a replay after reconnecting)
  w.lastStepId = t.step_id;
  w.lastStepAt = t.time;
  // A request keeps its row while it stays in the batch; the lowest free row goes to a newcomer.
  const present = new Set(t.reqs.map((r) => r[0]));
  for (const id of [...w.slots.keys()]) if (!present.has(id)) w.slots.delete(id);
  const taken = new Set(w.slots.values());
  let tokens = 0;
  let prefill = 0;
  const cells = t.reqs.map(([id, kind, n]) => {
    let slot = w.slots.get(id);
    if (slot === undefined) {
      slot = 0;
      while (taken.has(slot)) slot++;
      taken.add(slot);
      w.slots.set(id, slot);
    }
    tokens += n;
    if (kind === "p") prefill += n;
    return { id, kind, n, slot };
  });
  w.steps.push({ step: t.step_id, time: t.time, cells, tokens, prefill });
  if (w.steps.length > WINDOW_STEPS) w.steps.shift();
  w.rates.push([t.time, tokens, t.num_sampled]);
  setIfNewer(w.kv, { used: t.num_blocks_used, cached: t.num_blocks_cached || 0, total: t.num_blocks }, t.time);
  setIfNewer(w.running, t.reqs.length, t.time);
  setIfNewer(state.waiting, t.num_waiting, t.time);
  scheduleRender();
}

function onStats(s) {
  state.clockOffset = s.time - Date.now() / 1000;
  showSpecDecode(s);
  if (s.batcher_updated_at !== null) setIfNewer(state.waiting, s.num_waiting, s.batcher_updated_at);
  if (s.snapshot_at !== null) {
    for (const [id, ws] of Object.entries(s.workers)) {
      const w = workerState(id);
      const used = ws.num_blocks - ws.num_free_blocks;
      setIfNewer(w.kv, { used, cached: ws.num_cached_blocks, total: ws.num_blocks }, s.snapshot_at);
      setIfNewer(w.running, ws.num_running, s.snapshot_at);
    }
    for (const w of [...state.workers.values()]) {
      if (!(w.id in s.workers) && s.time - w.lastStepAt > GONE_AFTER_S) {
        if (w.el) w.el.remove();
        state.workers.delete(w.id);
      }
    }
  }
  scheduleRender();
}

// Speculative decoding, once anything was drafted: vLLM's mean acceptance length (tokens a drafting
// decode outputs), the share of draft tokens accepted, and the acceptance at each draft position.
function showSpecDecode(s) {
  $("spec-tile").hidden = s.spec_accepted_len === null;
  if (s.spec_accepted_len === null) return;
  $("spec-accepted-len").textContent = s.spec_accepted_len.toFixed(2);
  const perPos = s.spec_acceptance_per_pos.map((r) => r.toFixed(2)).join(" / ");
  const off = s.spec_num_workers_off ? `, off on ${s.spec_num_workers_off} worker(s)` : "";
  $("spec-detail").textContent =
    `mean accepted length (drafts ${(100 * s.spec_acceptance_rate).toFixed(0)}% accepted; ` +
    `by position ${perPos}${off})`;
}

function rates(w, now) {
  while (w.rates.length && w.rates[0][0] < now - RATE_WINDOW_S) w.rates.shift();
  let computed = 0;
  let generated = 0;
  for (const [, tokens, sampled] of w.rates) {
    computed += tokens;
    generated += sampled;
  }
  return { computed: computed / RATE_WINDOW_S, generated: generated / RATE_WINDOW_S };
}

// ----- drawing ----------------------------------------------------------------------------------

function scheduleRender() {
  if (!state.renderTimer) state.renderTimer = setTimeout(render, 80); // at most ~12 frames a second
}

function render() {
  state.renderTimer = 0;
  if (state.paused) return;
  const now = serverNow();
  let running = 0;
  let computed = 0;
  let generated = 0;
  const ids = [...state.workers.keys()].sort();
  for (const id of ids) {
    const w = state.workers.get(id);
    const r = rates(w, now);
    running += w.running.value;
    computed += r.computed;
    generated += r.generated;
    drawWorker(w, r);
  }
  $("no-workers").hidden = ids.length > 0;
  $("num-workers").textContent = ids.length;
  $("num-running").textContent = running;
  $("queue-depth").textContent = state.waiting.value;
  $("generated-rate").textContent = fmtRate(generated);
  $("computed-rate").textContent = fmtRate(computed);
}

function workerPanel(w) {
  if (w.el) return w.el;
  const el = document.createElement("div");
  el.className = "worker";
  el.dataset.testid = "worker";
  el.dataset.workerId = w.id;
  el.innerHTML = `
    <div class="worker-head">
      <span class="wid"></span>
      <span>step <b data-role="step">-</b></span>
      <span>in batch <b data-role="batch">0</b></span>
      <span class="kv">KV cache <span class="kv-bar" data-testid="kv-bar"><span class="kv-fill"></span><span class="kv-cached"></span></span>
        <b data-role="kv">0 / 0</b> blocks, <b data-role="kv-cached">0</b> cached</span>
      <span><b data-role="rate">0</b> tok/s generated</span>
    </div>
    <div class="plot"><div class="plot-label" data-role="chart-label">tokens / step</div>
      <div class="chart" data-testid="tokens-chart"></div></div>
    <div class="plot"><div class="plot-label">batch slots</div>
      <div class="grid" data-testid="batch-grid"></div></div>
    <div class="axis"><span data-role="first"></span><span>older ← steps → newer</span><span data-role="last"></span></div>`;
  el.querySelector(".wid").textContent = `worker ${w.id}`;
  const list = $("workers");
  const after = [...list.querySelectorAll(".worker")].find((other) => other.dataset.workerId > w.id);
  list.insertBefore(el, after || null);
  w.el = el;
  return el;
}

function drawWorker(w, r) {
  const el = workerPanel(w);
  const role = (name) => el.querySelector(`[data-role="${name}"]`);
  const last = w.steps[w.steps.length - 1];
  const kv = w.kv.value;
  const share = kv.total ? kv.used / kv.total : 0;
  role("step").textContent = last ? last.step : "-";
  role("batch").textContent = w.running.value;
  role("kv").textContent = `${kv.used} / ${kv.total}`;
  role("kv-cached").textContent = kv.cached;
  role("rate").textContent = fmtRate(r.generated);
  const bar = el.querySelector(".kv-bar");
  bar.dataset.used = kv.used;
  bar.dataset.total = kv.total;
  bar.dataset.cached = kv.cached;
  bar.classList.toggle("high", share > 0.8);
  const cachedShare = kv.total ? kv.cached / kv.total : 0;
  bar.title = `${(share * 100).toFixed(1)}% of the KV-cache blocks in use, ` +
    `${(cachedShare * 100).toFixed(1)}% free but holding cached prefixes`;
  bar.querySelector(".kv-fill").style.width = `${(share * 100).toFixed(1)}%`;
  bar.querySelector(".kv-cached").style.width = `${(cachedShare * 100).toFixed(1)}%`;

  const maxTokens = Math.max(1, ...w.steps.map((s) => s.tokens));
  role("chart-label").textContent = `tokens / step (max ${maxTokens})`;
  const bars = w.steps.map((s) => {
    const p = (100 * s.prefill) / maxTokens;
    const d = (100 * (s.tokens - s.prefill)) / maxTokens;
    return `<div class="col" title="step ${s.step}: ${s.prefill} prefill + ${s.tokens - s.prefill} decode tokens">` +
      `<div class="seg-d" style="height:${d}%"></div><div class="seg-p" style="height:${p}%"></div></div>`;
  });
  const cells = [];
  w.steps.forEach((s, col) => {
    for (const c of s.cells) {
      const kind = KIND_NAMES[c.kind] || "idle";
      const mine = c.id === state.mine ? " mine" : "";
      const what = c.kind === "p" ? `prefill chunk of ${c.n} tokens` : c.kind === "d" ? "decode" : "waiting in the batch";
      cells.push(
        `<div class="cell ${esc(c.kind)}${mine}" data-testid="batch-cell" data-kind="${kind}" ` +
          `data-req="${esc(c.id)}" data-step="${s.step}" data-tokens="${c.n}" ` +
          `style="grid-area:${c.slot + 1}/${col + 1};--h:${hue(c.id)}" ` +
          `title="${esc(c.id)} · step ${s.step} · ${what}">${c.kind === "p" ? c.n : ""}</div>`,
      );
    }
  });
  for (const node of [el.querySelector(".chart"), el.querySelector(".grid")]) {
    node.style.setProperty("--cols", WINDOW_STEPS);
  }
  el.querySelector(".chart").innerHTML = bars.join("");
  const grid = el.querySelector(".grid");
  grid.innerHTML = cells.join("");
  grid.dataset.numSteps = w.steps.length;
  role("first").textContent = w.steps.length ? `step ${w.steps[0].step}` : "";
  role("last").textContent = last ? `step ${last.step}` : "";
}

// ----- the events connection --------------------------------------------------------------------

function setConnection(stateName, text) {
  const el = $("connection");
  el.dataset.state = stateName;
  el.textContent = text;
}

async function followEvents() {
  if (state.events) state.events.abort();
  const ctrl = new AbortController();
  state.events = ctrl;
  let delay = 500;
  while (!ctrl.signal.aborted) {
    setConnection("connecting", "connecting");
    try {
      // With several models, the chosen one's cell; else the server's default.
      const query = state.model ? `?model=${encodeURIComponent(state.model)}` : "";
      const resp = await fetch(`/v1/dashboard/events${query}`, { headers: authHeaders(), signal: ctrl.signal });
      if (resp.status === 401) {
        setConnection("unauthorized", state.key ? "wrong API key" : "API key required");
        return; // until a key is entered
      }
      if (!resp.ok) throw new Error(await errorMessage(resp));
      // The connection replays the recent steps: start the picture afresh from them.
      for (const w of state.workers.values()) if (w.el) w.el.remove();
      state.workers.clear();
      setConnection("live", "live");
      delay = 500;
      for await (const event of sseEvents(resp.body)) {
        if (event.event === "step") onStep(JSON.parse(event.data));
        else if (event.event === "stats") onStats(JSON.parse(event.data));
        else if (event.event === "unavailable") {
          setConnection("degraded", JSON.parse(event.data).message);
          continue;
        }
        if ($("connection").dataset.state !== "live") setConnection("live", "live");
      }
      throw new Error("the gateway closed the stream");
    } catch (err) {
      if (ctrl.signal.aborted) return;
      setConnection("error", `reconnecting: ${err.message}`);
    }
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 5000);
  }
}

async function showModel() {
  const select = $("model-select");
  try {
    const resp = await fetch("/v1/models", { headers: authHeaders() });
    const body = resp.ok ? await resp.json() : null;
    // Base models only: an adapter (a card with a parent) runs in its base model's cells.
    const bases = body ? body.data.filter((card) => !card.parent).map((card) => card.id) : [];
    const before = state.model;
    if (!bases.includes(state.model)) state.model = bases.length > 1 ? bases[0] : "";
    if (state.model !== before) followEvents(); // the feed of the model now shown
    select.innerHTML = bases.map((id) => `<option value="${esc(id)}">${esc(id)}</option>`).join("");
    select.value = state.model;
    select.hidden = bases.length < 2;
    $("model").textContent = bases.length ? `model: ${state.model || bases[0]}` : "";
  } catch (_) {
    $("model").textContent = "";
    select.hidden = true;
  }
}

function chooseModel() {
  state.model = $("model-select").value;
  $("model").textContent = `model: ${state.model}`;
  followEvents(); // that model's cell: the picture starts afresh from its recent steps
}

// ----- the playground ---------------------------------------------------------------------------

function setPlayground(stateName, text) {
  const el = $("playground-status");
  el.dataset.state = stateName;
  el.textContent = text;
}

async function sendPrompt(event) {
  event.preventDefault();
  if (state.play) return;
  const ctrl = new AbortController();
  state.play = ctrl;
  const output = $("output");
  output.textContent = "";
  $("send").disabled = true;
  $("stop").disabled = false;
  setPlayground("running", "waiting for the first token");
  const body = {
    messages: [{ role: "user", content: $("prompt").value }],
    max_tokens: Number($("max-tokens").value) || 64,
    temperature: Number($("temperature").value),
    stream: true,
    stream_options: { include_usage: true },
  };
  if (state.model) body.model = state.model;
  const start = performance.now();
  let firstAt = null;
  let numChunks = 0;
  let usage = null;
  let finish = null;
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { ...authHeaders(), "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: ctrl.signal,
    });
    if (!resp.ok) throw new Error(await errorMessage(resp));
    // The batch view outlines this request's cells: it knows requests by the tail of their id.
    state.mine = (resp.headers.get("X-Request-Id") || "").slice(-8);
    const tag = $("playground-request");
    tag.textContent = state.mine;
    tag.style.setProperty("--h", hue(state.mine));
    tag.hidden = !state.mine;
    for await (const sse of sseEvents(resp.body)) {
      if (sse.data === "[DONE]") break;
      const chunk = JSON.parse(sse.data);
      if (chunk.error) throw new Error(chunk.error.message);
      const choice = chunk.choices && chunk.choices[0];
      if (choice && choice.delta && choice.delta.content) {
        if (firstAt === null) firstAt = performance.now();
        numChunks += 1;
        output.textContent += choice.delta.content;
        output.scrollTop = output.scrollHeight;
        setPlayground("running", `streaming: ${numChunks} chunks`);
      }
      if (choice && choice.finish_reason) finish = choice.finish_reason;
      if (chunk.usage) usage = chunk.usage;
    }
    const seconds = (performance.now() - start) / 1000;
    const tokens = usage ? usage.completion_tokens : numChunks;
    const ttft = firstAt === null ? "-" : `${Math.round(firstAt - start)} ms`;
    setPlayground(
      "done",
      `${tokens} tokens (${finish || "?"}) · first token ${ttft} · ${fmtRate(tokens / seconds)} tok/s`,
    );
  } catch (err) {
    if (ctrl.signal.aborted) setPlayground("stopped", "stopped");
    else setPlayground("error", err.message);
  } finally {
    state.play = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    scheduleRender();
  }
}

// ----- wiring -----------------------------------------------------------------------------------

function useKey(event) {
  event.preventDefault();
  state.key = $("api-key").value.trim();
  if (state.key) sessionStorage.setItem(KEY_STORAGE, state.key);
  else sessionStorage.removeItem(KEY_STORAGE);
  followEvents();
  showModel();
}

function togglePause() {
  state.paused = !state.paused;
  $("pause").textContent = state.paused ? "Resume" : "Pause";
  document.body.dataset.paused = state.paused;
  scheduleRender();
}

document.addEventListener("DOMContentLoaded", () => {
  $("api-key").value = state.key;
  $("key-form").addEventListener("submit", useKey);
  $("playground-form").addEventListener("submit", sendPrompt);
  $("stop").addEventListener("click", () => state.play && state.play.abort());
  $("pause").addEventListener("click", togglePause);
  $("model-select").addEventListener("change", chooseModel);
  setInterval(scheduleRender, 500); // rates decay while nothing is scheduled
  followEvents();
  showModel();
});
