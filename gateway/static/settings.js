// The settings panel: the model picker and the sampling controls, whose limits are shown in
// the form and checked before a request leaves the page (the server checks them again, with
// the same limits, and names the field if one is off).

const $ = (id) => document.getElementById(id);

let maxModelLen = 1 << 20; // until /v1/models says

export function setMaxModelLen(n) {
  maxModelLen = n;
  const input = $("max-tokens");
  input.max = String(n);
  $("max-tokens-limit").textContent = `1 – ${n} (the model's context)`;
  if (Number(input.value) > n) input.value = String(n);
}

// The model picker: the base model, then its LoRA adapters under "LoRA adapters of <base>";
// the label says what the choice is. Shown only when there is a choice; a choice still served
// survives a refill (a new API key).
function showModelKind() {
  const option = $("model-pick").selectedOptions[0];
  const parent = option?.dataset.parent;
  $("model-kind").textContent = parent ? `(a LoRA adapter of ${parent})` : "(the base model)";
}

export function setModels(models) {
  const pick = $("model-pick");
  const chosen = pick.value;
  const groups = new Map(); // parent -> its adapters' optgroup
  const entries = [];
  for (const m of models) {
    const option = document.createElement("option");
    option.value = option.textContent = m.id;
    if (m.parent === null) {
      entries.push(option);
      continue;
    }
    option.dataset.parent = m.parent;
    if (!groups.has(m.parent)) {
      const group = document.createElement("optgroup");
      group.label = `LoRA adapters of ${m.parent}`;
      groups.set(m.parent, group);
      entries.push(group);
    }
    groups.get(m.parent).append(option);
  }
  pick.replaceChildren(...entries);
  if (models.some((m) => m.id === chosen)) pick.value = chosen;
  $("model-setting").hidden = models.length < 2;
  showModelKind();
}

export function bindSettings() {
  $("model-pick").addEventListener("change", showModelKind);
  for (const id of ["temperature", "top-p"]) {
    const show = () => { $(`${id}-value`).textContent = $(id).value; };
    $(id).addEventListener("input", show);
    show();
  }
}

function intField(id, name, low, high) {
  const raw = $(id).value.trim();
  const value = Number(raw);
  if (!/^-?\d+$/.test(raw) || value < low || value > high) {
    throw new RangeError(`${name} must be a whole number in [${low}, ${high}]`);
  }
  return value;
}

// The generate frame's fields from the settings: `model` as over HTTP (the base model or a
// LoRA adapter; left out until /v1/models has answered), then the sampling fields
// (SamplingParams' own names).
export function samplingParams() {
  const params = {
    ...($("model-pick").value ? { model: $("model-pick").value } : {}),
    max_tokens: intField("max-tokens", "max tokens", 1, maxModelLen),
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
  };
  if ($("top-k").value.trim()) params.top_k = intField("top-k", "top_k", -1, 2147483647);
  if ($("seed").value.trim()) params.seed = intField("seed", "seed", 0, Number.MAX_SAFE_INTEGER);
  return params;
}

export function systemPrompt() {
  return $("system").value.trim();
}
