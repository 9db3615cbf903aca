// The server's API as the page uses it, and the API key.
// The key lives in this module's memory only: never in a URL, a cookie or web storage. HTTP
// calls send it as a Bearer header; the websocket, which cannot carry headers, offers it as a
// subprotocol beside "troupe.v1" (the server selects troupe.v1 and never echoes the key).

let apiKey = "";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function setKey(key) {
  apiKey = key;
}

export function hasKey() {
  return apiKey !== "";
}

function base64url(text) {
  let binary = "";
  for (const byte of new TextEncoder().encode(text)) binary += String.fromCharCode(byte);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

export function openSocket() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const protocols = ["troupe.v1"];
  if (apiKey) protocols.push("troupe.key." + base64url(apiKey));
  return new WebSocket(`${scheme}//${location.host}/v1/ws`, protocols);
}

export async function getJSON(path) {
  const headers = apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
  const resp = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
  let body = null;
  try {
    body = await resp.json();
  } catch {
    // not JSON: the status says enough
  }
  if (!resp.ok) {
    const message = body?.error?.message ?? `HTTP ${resp.status}`;
    throw new ApiError(resp.status, resp.status === 401 ? `API key needed: ${message}` : message);
  }
  return body;
}

// What the server serves: the base model first (its name and context length, which bounds max
// tokens), then its LoRA adapters, each with its `parent` (the base model's id).
export async function modelInfo() {
  const { data } = await getJSON("/v1/models");
  return {
    name: data[0].id,
    maxModelLen: data[0].max_model_len,
    models: data.map((m) => ({ id: m.id, parent: m.parent ?? null })),
  };
}
