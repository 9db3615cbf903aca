// The chat: a conversation kept in this page, sent whole (system prompt first) with each
// request over the websocket as chat messages, so the server applies the model's template.
// One reply streams at a time; Stop cancels it in the engine, Regenerate asks again.

import { getJSON, openSocket } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import { samplingParams, systemPrompt } from "./settings.js";

const $ = (id) => document.getElementById(id);

const history = []; // {role, content, node}: what the next request sends after the system prompt
let socket = null; // the open websocket (reopened when the API key changes)
let current = null; // the reply streaming now
let counter = 0;

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

function setRunning(running) {
  $("send").disabled = running;
  $("stop").disabled = !running;
  const last = history[history.length - 1];
  $("regenerate").disabled = running || last === undefined;
}

function addMessage(role, content) {
  const node = document.createElement("article");
  node.className = `msg ${role}`;
  node.dataset.role = role;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = role;
  const body = document.createElement("div");
  body.className = "body";
  if (role === "user") body.textContent = content;
  const meta = document.createElement("div");
  meta.className = "meta";
  node.append(who, body, meta);
  $("messages").append(node);
  node.scrollIntoView({ block: "end" });
  return node;
}

function showMeta(reply, finish) {
  const parts = [];
  if (reply.firstAt !== null) parts.push(["ttft", `TTFT ${Math.round(reply.firstAt - reply.sentAt)} ms`]);
  const seconds = (reply.lastAt - reply.firstAt) / 1000;
  // Decode rate: the tokens after the first, over the time since the first arrived.
  if (reply.tokens > 1 && seconds > 0) parts.push(["tps", `${((reply.tokens - 1) / seconds).toFixed(1)} tok/s`]);
  parts.push(["ntokens", `${reply.tokens} tokens`]);
  if (finish) parts.push(["finish", finish]);
  const meta = reply.node.querySelector(".meta");
  meta.replaceChildren(...parts.map(([name, text]) => {
    const span = document.createElement("span");
    span.className = name;
    span.textContent = text;
    return span;
  }));
}

function renderReply(reply) {
  reply.isDirty = false;
  reply.node.querySelector(".body").replaceChildren(renderMarkdown(reply.text));
}

function connect() {
  if (socket && socket.readyState === WebSocket.OPEN) return Promise.resolve(socket);
  return new Promise((resolve, reject) => {
    const ws = openSocket();
    ws.onopen = () => { socket = ws; resolve(ws); };
    ws.onerror = () => reject(new Error("could not open the websocket"));
    ws.onclose = (ev) => {
      if (socket === ws) socket = null;
      if (current && current.socket === ws) fail(`connection closed${ev.reason ? ": " + ev.reason : ""}`);
    };
    ws.onmessage = (ev) => onFrame(JSON.parse(ev.data));
  });
}

// A new API key: the next request opens a socket that carries it.
export function reconnect() {
  if (socket) socket.close();
  socket = null;
}

function onFrame(frame) {
  if (frame.request_id === null && frame.type === "error") return setStatus(frame.message, true);
  if (!current || frame.request_id !== current.id) return; // a reply already given up on
  if (frame.type === "delta") {
    const now = performance.now();
    if (current.firstAt === null) {
      current.firstAt = now;
      setStatus("streaming");
    }
    current.lastAt = now;
    current.tokens += frame.token_ids.length;
    current.text += frame.text;
    if (!current.isDirty) {
      // Re-rendered at most once a frame: a fast stream does not re-parse per token.
      current.isDirty = true;
      const reply = current;
      requestAnimationFrame(() => { if (reply.isDirty) { renderReply(reply); showMeta(reply); } });
    }
  } else if (frame.type === "done") {
    const reply = current;
    current = null;
    reply.tokens = frame.usage.completion_tokens;
    renderReply(reply);
    history.push({ role: "assistant", content: reply.text, node: reply.node });
    const finish = frame.finish_reason === "abort" ? "stopped" : frame.finish_reason;
    showMeta(reply, finish);
    setStatus(frame.finish_reason === "abort" ? "stopped" : `done (${frame.finish_reason})`);
    setRunning(false);
  } else if (frame.type === "error") {
    fail(frame.field ? `${frame.message} (${frame.field})` : frame.message);
  }
}

// The reply failed: show why in its place; it does not join the conversation.
function fail(message) {
  if (!current) return;
  const reply = current;
  current = null;
  reply.node.classList.add("error");
  const body = reply.node.querySelector(".body");
  body.replaceChildren(renderMarkdown(reply.text));
  const why = document.createElement("p");
  why.className = "why";
  why.textContent = message;
  body.append(why);
  setStatus(`error: ${message}`, true);
  setRunning(false);
}

async function explain(err) {
  try {
    await getJSON("/v1/models"); // the server is there and the key (if any) is right
    return err.message;
  } catch (probe) {
    return probe.message;
  }
}

// The sampling fields, or null (and why, in the status line) if one is out of its limits.
function readParams() {
  try {
    return samplingParams();
  } catch (err) {
    setStatus(err.message, true);
    return null;
  }
}

async function startReply(params) {
  const messages = [];
  const system = systemPrompt();
  if (system) messages.push({ role: "system", content: system });
  for (const m of history) messages.push({ role: m.role, content: m.content });
  const id = `chat-${++counter}`;
  const node = addMessage("assistant", "");
  current = { id, node, socket: null, sentAt: performance.now(), firstAt: null, lastAt: null,
    tokens: 0, text: "", isDirty: false };
  setRunning(true);
  setStatus("connecting");
  let ws;
  try {
    ws = await connect();
  } catch (err) {
    fail(await explain(err));
    return;
  }
  if (!current || current.id !== id) return; // stopped while connecting
  current.socket = ws;
  current.sentAt = performance.now();
  setStatus("waiting");
  ws.send(JSON.stringify({ type: "generate", request_id: id, messages, ...params }));
}

export function send() {
  const prompt = $("prompt");
  if (current || !prompt.value.trim()) return;
  const params = readParams();
  if (!params) return;
  const text = prompt.value;
  prompt.value = "";
  history.push({ role: "user", content: text, node: addMessage("user", text) });
  startReply(params);
}

export function stop() {
  if (!current) return;
  if (current.socket) {
    current.socket.send(JSON.stringify({ type: "cancel", request_id: current.id }));
    setStatus("stopping");
  } else {
    fail("stopped before it was sent");
  }
}

// Ask again: the last reply (if the conversation ends with one) is dropped and re-asked.
export function regenerate() {
  if (current || history.length === 0) return;
  const params = readParams();
  if (!params) return;
  if (history[history.length - 1].role === "assistant") history.pop().node.remove();
  for (const node of document.querySelectorAll("#messages .msg.error")) node.remove();
  startReply(params);
}

export function newChat() {
  if (current) {
    stop();
    current = null; // its last frames are ignored: it belongs to no conversation now
  }
  history.length = 0;
  $("messages").replaceChildren();
  setRunning(false);
  setStatus("idle");
}

export function bindChat() {
  $("send").addEventListener("click", send);
  $("stop").addEventListener("click", stop);
  $("regenerate").addEventListener("click", regenerate);
  $("new-chat").addEventListener("click", newChat);
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault(); // Shift+Enter keeps its new line
      send();
    } else if (ev.key === "Escape") {
      stop();
    }
  });
  setRunning(false);
}
