// The sampling controls: limits shown in the form, checked before a request leaves the page
// (the server checks them again, with the same limits, and names the field if one is off).

const $ = (id) => document.getElementById(id);

let maxModelLen = 1 << 20; // until /v1/models says

export function setMaxModelLen(n) {
  maxModelLen = n;
  const input = $("max-tokens");
  input.max = String(n);
  $("max-tokens-limit").textContent = `1 – ${n} (the model's context)`;
  if (Number(input.value) > n) input.value = String(n);
}

export function bindSliders() {
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

// The generate frame's sampling fields (SamplingParams' own names).
export function samplingParams() {
  const params = {
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
