// The playground: builds /v1/decisions or /v1/systemone requests, draws the answers, streams chat.
// Plain ES module, no build step, no external resources.
import { EXAMPLES } from "/playground/examples.js";

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => [...root.querySelectorAll(sel)];

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("#api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// ---- tabs ---------------------------------------------------------------------------------
function selectTab(tab) {
  for (const t of $$("[role=tab]")) {
    const on = t === tab;
    t.setAttribute("aria-selected", String(on));
    t.tabIndex = on ? 0 : -1;
    $("#" + t.getAttribute("aria-controls")).hidden = !on;
  }
  tab.focus();
}
for (const tab of $$("[role=tab]")) {
  tab.addEventListener("click", () => selectTab(tab));
  tab.addEventListener("keydown", (e) => {
    const tabs = $$("[role=tab]");
    const i = tabs.indexOf(tab);
    if (e.key === "ArrowRight") selectTab(tabs[(i + 1) % tabs.length]);
    if (e.key === "ArrowLeft") selectTab(tabs[(i - 1 + tabs.length) % tabs.length]);
  });
}

// ---- options and extra questions ----------------------------------------------------------
const MAX_OPTIONS = 255; // the server's limit (decisions and System One choices)

function relabel() {
  const count = $$("#options .option").length;
  $("#option-count").textContent = `${count} of ${MAX_OPTIONS} options`;
  $("#add-option").disabled = count >= MAX_OPTIONS;
  $$("#options .option").forEach((li, i) => {
    $(".opt-id", li).setAttribute("aria-label", `Option ${i + 1} id`);
    $(".opt-desc", li).setAttribute("aria-label", `Option ${i + 1} description`);
    $(".up", li).setAttribute("aria-label", `Move option ${i + 1} up`);
    $(".down", li).setAttribute("aria-label", `Move option ${i + 1} down`);
    $(".remove", li).setAttribute("aria-label", `Remove option ${i + 1}`);
  });
  $$("#extras .extra").forEach((li, i) => {
    $(".extra-question", li).setAttribute("aria-label", `Extra question ${i + 1}`);
    $(".remove", li).setAttribute("aria-label", `Remove extra question ${i + 1}`);
  });
}

function addOption(id = "", desc = "") {
  const li = $("#option-row").content.firstElementChild.cloneNode(true);
  $(".opt-id", li).value = id;
  $(".opt-desc", li).value = desc;
  $(".remove", li).addEventListener("click", () => { li.remove(); relabel(); });
  $(".up", li).addEventListener("click", () => {
    if (li.previousElementSibling) li.parentNode.insertBefore(li, li.previousElementSibling);
    relabel(); $(".up", li).focus();
  });
  $(".down", li).addEventListener("click", () => {
    if (li.nextElementSibling) li.parentNode.insertBefore(li.nextElementSibling, li);
    relabel(); $(".down", li).focus();
  });
  $("#options").append(li);
  relabel();
  return li;
}

function addExtra(text = "") {
  const li = $("#extra-row").content.firstElementChild.cloneNode(true);
  $(".extra-question", li).value = text;
  $(".remove", li).addEventListener("click", () => { li.remove(); relabel(); });
  $("#extras").append(li);
  relabel();
  return li;
}

$("#add-option").addEventListener("click", () => $(".opt-id", addOption()).focus());
$("#bulk-apply").addEventListener("click", () => {
  const lines = $("#bulk-options").value.split("\n").map((l) => l.trim()).filter(Boolean);
  if (lines.length > MAX_OPTIONS) {
    $("#options-error").textContent = `${lines.length} options pasted; the limit is ${MAX_OPTIONS}.`;
    return;
  }
  $("#options-error").textContent = "";
  $("#options").replaceChildren();
  for (const line of lines) {
    const at = line.indexOf(":");
    if (at < 0) addOption(line, "");
    else addOption(line.slice(0, at).trim(), line.slice(at + 1).trim());
  }
  relabel();
});
$("#add-extra").addEventListener("click", () => $(".extra-question", addExtra()).focus());

function shape() { return $("input[name=shape]:checked").value; }
for (const r of $$("input[name=shape]")) {
  r.addEventListener("change", () => { $("#s1-type-row").hidden = shape() !== "systemone"; });
}

// ---- examples -------------------------------------------------------------------------------
EXAMPLES.forEach((ex, i) => $("#example").append(new Option(ex.name, String(i))));
$("#example").addEventListener("change", (e) => {
  const ex = EXAMPLES[Number(e.target.value)];
  if (!ex) return;
  $(`input[name=shape][value=${ex.shape}]`).checked = true;
  $("#s1-type-row").hidden = ex.shape !== "systemone";
  if (ex.type) $("#s1-type").value = ex.type;
  $("#state").value = ex.state;
  $("#question").value = ex.question;
  $("#options").replaceChildren();
  ex.options.forEach(([id, d]) => addOption(id, d));
  $("#extras").replaceChildren();
  ex.extras.forEach((q) => addExtra(q));
  clearErrors();
});

// ---- requests ---------------------------------------------------------------------------------
function stateValue() {
  const text = $("#state").value;
  const trimmed = text.trim();
  if (trimmed.startsWith("{") || trimmed.startsWith("[")) {
    try { return JSON.parse(trimmed); } catch { /* not JSON: send it as text */ }
  }
  return text;
}

function optionList() {
  return $$("#options .option").map((li) => ({
    id: $(".opt-id", li).value, description: $(".opt-desc", li).value,
  }));
}

function questionTexts() {
  return [$("#question").value, ...$$("#extras .extra-question").map((i) => i.value)];
}

// The readout fields both APIs take (docs/api.md); none sent: the server's default.
function readoutFields() {
  const readout = $("#readout").value;
  const fields = {};
  if (readout) fields.readout = readout;
  const normalization = $("#normalization").value;  // empty: the server's default
  if (readout === "continuation" && normalization) fields.normalization = normalization;
  if (readout === "deliberate") {
    const budget = $("#deliberation-tokens").value.trim();
    if (budget) fields.deliberation_tokens = Number(budget);  // empty: the server's default
    fields.return_reasoning = true;
  }
  const bias = $("#bias-correction").value;
  if (bias) fields.bias_correction = bias;  // empty: the server's default
  return fields;
}

function showReadoutRows() {
  $("#normalization-row").hidden = $("#readout").value !== "continuation";
  $("#deliberation-row").hidden = $("#readout").value !== "deliberate";
}
$("#readout").addEventListener("change", showReadoutRows);

function decisionsRequest() {
  const state = stateValue();
  const options = optionList();
  const decisions = questionTexts().map((question, i) => ({
    id: `q${i + 1}`, state, question, options, return_prompt: true, ...readoutFields(),
  }));
  return decisions.length === 1 ? { decision: decisions[0] } : { decisions };
}

function systemOneRequest() {
  const type = $("#s1-type").value;
  const options = optionList();
  let criteria;
  if (type === "choice") criteria = Object.fromEntries(options.map((o) => [o.id, o.description]));
  if (type === "score") criteria = options.map((o) => o.description);
  if (type === "noul") {
    criteria = {};
    for (const o of options) if (o.id === "true" || o.id === "false") criteria[o.id] = o.description;
  }
  const questions = {};
  questionTexts().forEach((q, i) => {
    questions[`q${i + 1}`] = { type, instructions: q, criteria, ...readoutFields() };
  });
  return { model: "jev-latest", state: stateValue(), questions };
}

// ---- errors next to their fields ----------------------------------------------------------
function clearErrors() {
  for (const p of $$("#decide-form .error")) p.textContent = "";
  for (const el of $$("#decide-form [aria-invalid]")) el.removeAttribute("aria-invalid");
}

function showError(field, message) {
  // field: "decision.question", "decisions[2].options[1].id", "questions.q2.criteria", "state"...
  const f = field || "body";
  const index = Number((f.match(/^decisions\[(\d+)\]/) || f.match(/^questions\.q(\d+)/) || [0, 0])[1]);
  const extraIndex = f.startsWith("questions.") ? index - 2 : index - 1;
  let target = "#body-error";
  let input = null;
  if (/(^|\.)state\b/.test(f)) { target = "#state-error"; input = $("#state"); }
  else if (/(^|\.)(question|instructions)\b/.test(f)) {
    if (extraIndex >= 0 && $$("#extras .extra")[extraIndex]) {
      const li = $$("#extras .extra")[extraIndex];
      $(".error", li).textContent = message;
      $(".extra-question", li).setAttribute("aria-invalid", "true");
      return;
    }
    target = "#question-error"; input = $("#question");
  } else if (/(^|\.)(readout|normalization|bias_correction|deliberation_tokens|return_reasoning)\b/.test(f)) {
    target = "#readout-error"; input = $("#readout");
  } else if (/(^|\.)(options|criteria)\b/.test(f)) {
    target = "#options-error";
    const row = f.match(/(?:options|criteria)\[(\d+)\]/);
    if (row && $$("#options .option")[Number(row[1])]) {
      for (const i of $$("input", $$("#options .option")[Number(row[1])])) i.setAttribute("aria-invalid", "true");
    }
  }
  $(target).textContent = message;
  if (input) input.setAttribute("aria-invalid", "true");
}

function showApiError(status, body) {
  if (body && Array.isArray(body.detail)) {  // System One: FastAPI's 422 shape
    for (const d of body.detail) {
      const loc = (d.loc || []).filter((p) => p !== "body").join(".");
      showError(loc, `${d.msg} (HTTP ${status})`);
    }
    return;
  }
  const err = (body && body.error) || {};
  showError(err.field, `${err.message || "request failed"} (HTTP ${status})`);
}

// ---- results --------------------------------------------------------------------------------
const pct = (p) => `${(100 * p).toFixed(1)} %`;

function bars(rows) {
  // rows: [{name, p, logit?}] in the order they were requested
  const top = rows.reduce((best, r, i) => (r.p > rows[best].p ? i : best), 0);
  const ul = document.createElement("ul");
  ul.className = "bars";
  rows.forEach((r, i) => {
    const li = document.createElement("li");
    li.className = "bar-row" + (i === top ? " top" : "");
    li.dataset.probability = String(r.p);
    li.dataset.option = r.name;
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = r.name + (i === top ? " (top)" : "");
    const track = document.createElement("span");
    track.className = "bar-track";
    track.setAttribute("role", "meter");
    track.setAttribute("aria-label", `${r.name} probability`);
    track.setAttribute("aria-valuemin", "0");
    track.setAttribute("aria-valuemax", "100");
    track.setAttribute("aria-valuenow", (100 * r.p).toFixed(1));
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.display = "block";
    bar.style.width = `${(100 * r.p).toFixed(2)}%`;
    track.append(bar);
    const value = document.createElement("span");
    value.className = "pct";
    value.textContent = pct(r.p);
    li.append(name, track, value);
    if (r.logit !== undefined) {
      const logit = document.createElement("span");
      logit.className = "logit";
      logit.textContent = `logit ${r.logit.toFixed(3)}`;
      li.append(logit);
    }
    ul.append(li);
  });
  return ul;
}

function facts(pairs) {
  const dl = document.createElement("dl");
  dl.className = "facts";
  for (const [k, v] of pairs) {
    if (v === undefined || v === null) continue;
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    dl.append(dt, dd);
  }
  return dl;
}

function card(title) {
  const div = document.createElement("article");
  div.className = "result";
  const h = document.createElement("h2");
  h.textContent = title;
  div.append(h);
  return div;
}

// A deliberate answer's reasoning (the text the model wrote before its letter was read).
function reasoning(div, deliberation) {
  if (!deliberation) return;
  const details = document.createElement("details");
  details.className = "reasoning";
  const summary = document.createElement("summary");
  summary.textContent = `Reasoning (${deliberation.tokens} tokens)`;
  const pre = document.createElement("pre");
  pre.textContent = deliberation.text || "";
  details.append(summary, pre);
  div.append(details);
}

function renderDecisions(body, questions) {
  const results = body.results || [body.result];
  return results.map((r, i) => {
    const div = card(`${r.id}: ${questions[i]}`);
    div.append(bars(r.option_ids.map((id, j) => ({ name: id, p: r.probabilities[j], logit: r.option_logits[j] }))));
    div.append(facts([
      ["allowed token mass", pct(r.allowed_token_mass)],
      ["input tokens", String(r.input_tokens)],
      ["forward", `${(1000 * r.timing.forward_seconds).toFixed(1)} ms`],
      ["total", `${(1000 * r.timing.total_seconds).toFixed(1)} ms`],
      ["readout", r.readout],
      ["prompt", `${r.prompt_version}, sha256 ${r.prompt_sha256.slice(0, 12)}…`],
    ]));
    reasoning(div, r.deliberation);
    if (r.prompt) {
      const details = document.createElement("details");
      const summary = document.createElement("summary");
      summary.textContent = "Rendered prompt";
      const pre = document.createElement("pre");
      pre.textContent = r.prompt;
      details.append(summary, pre);
      div.append(details);
    }
    return div;
  });
}

function renderSystemOne(body, questions) {
  return Object.entries(body.answers).map(([qid, a], i) => {
    const div = card(`${qid}: ${questions[i]}`);
    let rows;
    if (a.type === "noul") rows = [{ name: "yes", p: a.noul }, { name: "no", p: 1 - a.noul }];
    else if (a.type === "score") rows = Object.entries(a.probabilities).map(([k, p]) => ({ name: `${k}: ${a.legend[k]}`, p }));
    else rows = Object.entries(a.probabilities).map(([k, p]) => ({ name: k, p }));
    div.append(bars(rows));
    div.append(facts([
      ["type", a.type],
      ["choice", a.choice],
      ["expected level", a.score !== undefined ? a.score.toFixed(3) : undefined],
      ["confidence", a.confidence !== undefined ? a.confidence.toFixed(3) : undefined],
      ["readout", a.readout],
      ["input tokens", String(body.usage.input_tokens)],
      ["model", body.model],
    ]));
    reasoning(div, a.deliberation);
    return div;
  });
}

$("#decide-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  clearErrors();
  const s1 = shape() === "systemone";
  const request = s1 ? systemOneRequest() : decisionsRequest();
  const questions = questionTexts();
  $("#decide").disabled = true;
  $("#decide-status").textContent = "Asking the model…";
  try {
    const resp = await fetch(s1 ? "/v1/systemone" : "/v1/decisions", {
      method: "POST", headers: headers(), body: JSON.stringify(request),
    });
    const body = await resp.json().catch(() => null);
    if (!resp.ok) {
      showApiError(resp.status, body);
      $("#decide-status").textContent = `Error ${resp.status}`;
      return;
    }
    $("#results").replaceChildren(...(s1 ? renderSystemOne(body, questions) : renderDecisions(body, questions)));
    $("#decide-status").textContent = "Done";
  } catch (err) {
    showError("body", `The server did not answer: ${err}`);
    $("#decide-status").textContent = "";
  } finally {
    $("#decide").disabled = false;
  }
});

// ---- chat -------------------------------------------------------------------------------------
const history = [];

function bubble(role, text) {
  const li = document.createElement("li");
  li.className = role;
  li.textContent = text;
  $("#chat-log").append(li);
  return li;
}

async function streamChat(li) {
  const resp = await fetch("/v1/chat/completions", {
    method: "POST", headers: headers(),
    body: JSON.stringify({ messages: history, stream: true, max_tokens: 256 }),
  });
  if (!resp.ok) {
    const body = await resp.json().catch(() => null);
    throw new Error(`${(body && body.error && body.error.message) || resp.statusText} (HTTP ${resp.status})`);
  }
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let text = "";
  li.dataset.updates = "0";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6).trim();
        if (data === "[DONE]") return text;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "stream failed");
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          text += delta.content;
          li.textContent = text;
          li.dataset.updates = String(Number(li.dataset.updates) + 1);
        }
      }
    }
  }
  return text;
}

$("#chat-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  $("#chat-error").textContent = "";
  const input = $("#chat-input");
  const text = input.value.trim();
  if (!text) { $("#chat-error").textContent = "Write a message first."; input.focus(); return; }
  history.push({ role: "user", content: text });
  bubble("user", text);
  input.value = "";
  const li = bubble("assistant", "…");
  $("#chat-send").disabled = true;
  try {
    const answer = await streamChat(li);
    history.push({ role: "assistant", content: answer });
    li.dataset.done = "true";
  } catch (err) {
    $("#chat-error").textContent = String(err.message || err);
    li.remove();
    history.pop();
  } finally {
    $("#chat-send").disabled = false;
    input.focus();
  }
});
$("#chat-input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("#chat-form").requestSubmit();
});
$("#chat-clear").addEventListener("click", () => { history.length = 0; $("#chat-log").replaceChildren(); });

// ---- start ------------------------------------------------------------------------------------
async function loadModel() {
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    const body = await resp.json();
    $("#model-line").textContent = resp.ok
      ? `Model: ${(body.models && body.models[0].name) || (body.data && body.data[0].id)}`
      : "Enter the API key to use this server.";
  } catch {
    $("#model-line").textContent = "Could not reach the server.";
  }
}
$("#api-key").addEventListener("change", loadModel);
addOption("yes", "The statement holds");
addOption("no", "The statement does not hold");
loadModel();
document.body.dataset.ready = "true";
