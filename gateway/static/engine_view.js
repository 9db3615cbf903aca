// The live engine view: the actor graph (boxes and arrows, each arrow's message rate, each
// inbox's depth), KV pools, queues, preemptions, prefix cache and latency percentiles, from
// GET /v1/engine/stats about once a second while this tab is shown (nothing polls otherwise).
// Rates are differences between two snapshots over the engine's own clock.

import { getJSON } from "./api.js";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const W = 132;
const H = 58;
// Where the known actors sit; an actor added later gets a place in the bottom row.
const PLACES = {
  client: [20, 30], tokenizer: [230, 30], admission: [440, 30],
  streamer: [230, 190], scheduler: [440, 190], allocator: [650, 190], executor: [440, 340],
  grammar: [650, 340],
};
const NUM_PLACED = Object.keys(PLACES).length;
const PERIOD_MS = 1000;

let timer = null;
let loop = 0; // the polling loop's generation: a hidden view ends it, showing starts a new one
let previous = null;
let numPolls = 0;
const nodes = new Map(); // name -> {box, inbox, busy}
const edges = new Map(); // "a>b" -> {line, label}

function svg(tag, attrs, parent) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  parent.append(node);
  return node;
}

function place(name) {
  if (!PLACES[name]) PLACES[name] = [20 + 210 * (Object.keys(PLACES).length - NUM_PLACED), 340];
  return PLACES[name];
}

function node(name) {
  if (nodes.has(name)) return nodes.get(name);
  const [x, y] = place(name);
  const g = svg("g", { class: "actor", "data-actor": name }, $("graph-nodes"));
  const box = svg("rect", { x, y, width: W, height: H, rx: 8 }, g);
  svg("text", { x: x + W / 2, y: y + 20, class: "name" }, g).textContent = name;
  const inbox = svg("text", { x: x + W / 2, y: y + 37, class: "inbox" }, g);
  const busy = svg("text", { x: x + W / 2, y: y + 51, class: "busy" }, g);
  const entry = { box, inbox, busy };
  nodes.set(name, entry);
  return entry;
}

// The arrow from a's border to b's, shifted sideways when b also sends to a.
function edge(a, b) {
  const key = `${a}>${b}`;
  if (edges.has(key)) return edges.get(key);
  node(a);
  node(b);
  const [ax, ay] = place(a).map((v, i) => v + (i ? H : W) / 2);
  const [bx, by] = place(b).map((v, i) => v + (i ? H : W) / 2);
  const dx = bx - ax;
  const dy = by - ay;
  const length = Math.hypot(dx, dy);
  const [nx, ny] = [-dy / length * 7, dx / length * 7]; // to this arrow's right
  const cut = Math.min(W / 2 / Math.abs(dx || 1e-9), H / 2 / Math.abs(dy || 1e-9)) + 0.04;
  const g = svg("g", { class: "channel", "data-edge": key }, $("graph-edges"));
  const line = svg("line", {
    x1: ax + dx * cut + nx, y1: ay + dy * cut + ny, x2: bx - dx * cut + nx, y2: by - dy * cut + ny,
    "marker-end": "url(#arrow)",
  }, g);
  // The label sits on the arrow's own side: beside a steep arrow, above or below a flat one.
  const isSteep = Math.abs(dy) > Math.abs(dx);
  const anchor = isSteep ? (nx > 0 ? "start" : "end") : "middle";
  const label = svg("text", {
    x: (ax + bx) / 2 + nx * (isSteep ? 1.2 : 2.6), y: (ay + by) / 2 + ny * 2.6 + 4,
    class: "rate", "text-anchor": anchor,
  }, g);
  const entry = { line, label };
  edges.set(key, entry);
  return entry;
}

function rate(now, before, dt) {
  return before === undefined || dt <= 0 ? null : (now - before) / dt;
}

function fmtRate(r) {
  if (r === null) return "–";
  return r >= 100 ? `${Math.round(r)}/s` : `${r.toFixed(1)}/s`;
}

function counts(snapshot) {
  const out = new Map();
  for (const actor of snapshot.graph.actors) {
    out.set(`busy:${actor.name}`, actor.busy_seconds);
    for (const c of actor.sent) {
      // "engine": the replies to the engine's calls (a reset, a weight update): its box too
      const receiver = c.receiver === "engine" ? "client" : c.receiver;
      out.set(`${actor.name}>${receiver}`, c.num_messages);
    }
    // The engine (client) is the tokenizer's only sender.
    if (actor.name === "tokenizer") out.set("client>tokenizer", actor.num_received);
  }
  return out;
}

function drawGraph(snapshot) {
  const now = counts(snapshot);
  const before = previous ? counts(previous) : new Map();
  const dt = previous ? snapshot.graph.time - previous.graph.time : 0;
  for (const [key, value] of now) {
    if (key.startsWith("busy:")) continue;
    const [a, b] = key.split(">");
    const r = rate(value, before.get(key), dt);
    const { line, label } = edge(a, b);
    label.textContent = fmtRate(r);
    label.dataset.count = String(value);
    line.classList.toggle("active", r !== null && r > 0);
  }
  const client = node("client");
  client.inbox.textContent = `inbox ${snapshot.graph.client_inbox_depth}/${snapshot.graph.client_inbox_buffer}`;
  client.busy.textContent = `${snapshot.num_streams} streams`;
  for (const actor of snapshot.graph.actors) {
    const entry = node(actor.name);
    const depth = actor.inbox_depth + actor.num_blocked_senders;
    const cap = actor.inbox_buffer === null ? "∞" : actor.inbox_buffer;
    entry.inbox.textContent = `inbox ${depth}/${cap}`;
    entry.inbox.dataset.depth = String(depth);
    const busy = rate(actor.busy_seconds, before.get(`busy:${actor.name}`), dt);
    entry.busy.textContent = busy === null ? "busy –" : `busy ${Math.round(busy * 100)}%`;
    entry.box.style.setProperty("--load", String(Math.min(1, busy ?? 0)));
  }
}

function setText(id, text) {
  $(id).textContent = String(text);
}

function ms(seconds) {
  if (seconds === null) return "–";
  return seconds < 0.01 ? `${(seconds * 1000).toFixed(1)} ms` : `${Math.round(seconds * 1000)} ms`;
}

function drawNumbers(snapshot) {
  const e = snapshot.engine;
  setText("ev-running", e.num_running);
  setText("ev-waiting", e.num_waiting);
  setText("ev-swapped", e.num_swapped);
  setText("ev-streams", snapshot.num_streams);
  setText("ev-preempt-swap", e.num_preemptions_swap);
  setText("ev-preempt-recompute", e.num_preemptions_recompute);
  const dt = previous ? snapshot.graph.time - previous.graph.time : 0;
  setText("ev-steps-rate", fmtRate(rate(e.num_steps, previous?.engine.num_steps, dt)));
  const hit = e.prefix_cache_query_tokens ? e.prefix_cache_hit_tokens / e.prefix_cache_query_tokens : null;
  setText("ev-prefix-hit", hit === null ? "–" : `${(hit * 100).toFixed(1)}%`);
  setText("ev-prefix-tokens", `${e.prefix_cache_hit_tokens} of ${e.prefix_cache_query_tokens} tokens`);
  const free = e.num_gpu_blocks - e.num_gpu_blocks_used - e.num_gpu_blocks_cached;
  setText("ev-gpu-used", e.num_gpu_blocks_used);
  setText("ev-gpu-cached", e.num_gpu_blocks_cached);
  setText("ev-gpu-free", free);
  setText("ev-gpu-total", e.num_gpu_blocks);
  bar("gpu-bar", e.num_gpu_blocks, [e.num_gpu_blocks_used, e.num_gpu_blocks_cached]);
  setText("ev-cpu-used", e.num_cpu_blocks_used);
  setText("ev-cpu-total", e.num_cpu_blocks);
  bar("cpu-bar", e.num_cpu_blocks, [e.num_cpu_blocks_used]);
  const lat = snapshot.latency;
  for (const [name, p] of [["ttft", lat.ttft], ["itl", lat.itl]]) {
    for (const q of ["p50", "p90", "p99"]) setText(`ev-${name}-${q}`, ms(p[q]));
    setText(`ev-${name}-count`, p.count);
  }
  setText("ev-window", `${Math.round(lat.window_s)} s`);
}

function bar(id, total, parts) {
  const segments = $(id).children;
  parts.forEach((n, i) => { segments[i].style.width = `${total ? (100 * n) / total : 0}%`; });
}

async function poll(generation) {
  timer = null;
  try {
    const snapshot = await getJSON("/v1/engine/stats");
    drawGraph(snapshot);
    drawNumbers(snapshot);
    previous = snapshot;
    numPolls += 1;
    $("engine-view").dataset.polls = String(numPolls);
    setText("ev-status", `updated ${new Date().toLocaleTimeString()}`);
    $("ev-status").classList.remove("error");
  } catch (err) {
    setText("ev-status", err.message);
    $("ev-status").classList.add("error");
  }
  if (generation === loop) timer = setTimeout(poll, PERIOD_MS, generation);
}

function isShown() {
  return !$("engine-view").hidden && document.visibilityState === "visible";
}

// Poll while the view is shown; stop when it is hidden (tab switch, page in the background).
export function updatePolling() {
  const isPolling = loop % 2 === 1;
  if (isShown() === isPolling) return;
  loop += 1; // odd: polling
  clearTimeout(timer);
  timer = null;
  if (isShown()) {
    previous = null; // rates over a gap would average it away
    poll(loop);
  }
}
