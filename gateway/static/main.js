// The page's entry: tabs, the API key field, the models served and the base model's limits;
// chat.js and engine_view.js do the rest. Plain ES modules served as they are: no build step,
// no CDN.

import { hasKey, modelInfo, setKey } from "./api.js";
import { bindChat, reconnect } from "./chat.js";
import { updatePolling } from "./engine_view.js";
import { bindSettings, setMaxModelLen, setModels } from "./settings.js";

const $ = (id) => document.getElementById(id);

function showTab(name) {
  for (const tab of ["chat", "engine"]) {
    const isShown = tab === name;
    $(`tab-${tab}`).setAttribute("aria-selected", String(isShown));
    $(`${tab}-view`).hidden = !isShown;
  }
  document.body.dataset.tab = name;
  updatePolling();
  if (name === "chat") $("prompt").focus();
}

async function loadModel() {
  try {
    const info = await modelInfo();
    setMaxModelLen(info.maxModelLen);
    setModels(info.models);
    $("key-status").textContent = hasKey() ? "key accepted" : "";
  } catch (err) {
    $("key-status").textContent = err.message;
    if (err.status === 401) $("api-key").focus();
  }
}

function bindKey() {
  // Read on change only: the key stays in memory (see api.js), never in the URL or storage.
  $("api-key").addEventListener("change", () => {
    setKey($("api-key").value);
    reconnect();
    loadModel();
  });
}

function bindTabs() {
  $("tab-chat").addEventListener("click", () => showTab("chat"));
  $("tab-engine").addEventListener("click", () => showTab("engine"));
  document.addEventListener("visibilitychange", updatePolling);
}

bindChat();
bindSettings();
bindKey();
bindTabs();
// On a narrow screen the settings start folded under the chat.
if (matchMedia("(max-width: 760px)").matches) $("settings").open = false;
showTab("chat");
loadModel();
document.body.dataset.ready = "true";
