// qlactors web page: plain JavaScript, no build step. Every value from the server is shown with
// textContent (never parsed as HTML). The token stays in this browser's localStorage and goes
// out only in the Authorization header of requests to this server.
"use strict";

const API = "/api/v1";
const LOG_CAP = 256 * 1024;  // the most of a log one view keeps: older bytes are dropped from the top
const REFRESH_MS = 2000;
const TERMINAL = ["succeeded", "failed", "cancelled", "timed_out"];  // `lost` is not: it is retried or fails
const $ = (id) => document.getElementById(id);
let token = localStorage.getItem("qlactors-token");
let openRun = null;          // the run shown in detail
let followed = null;         // the run whose log is shown (followed once, from the start)
let logStream = null;        // its live log's AbortController while it is followed
let olderCursor = null;
let logDecoder = new TextDecoder();  // one per followed log: a character may span two events

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(method, path, body) {
  const headers = { "Authorization": "Bearer " + token };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const answer = await fetch(API + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = answer.headers.get("content-type")?.includes("json") ? await answer.json() : null;
  if (!answer.ok) {
    const error = data?.error ?? { code: "http_" + answer.status, message: answer.statusText };
    if (answer.status === 401) signOut(error.message);
    throw new ApiError(answer.status, error.code, error.message);
  }
  return data;
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell ?? "";
    tr.appendChild(td);
  }
  return tr;
}

const when = (ms) => ms ? new Date(ms).toLocaleString() : "";
function duration(from, to) {
  if (!from) return "";
  const s = ((to ?? Date.now()) - from) / 1000;
  return s < 60 ? s.toFixed(1) + " s" : s < 3600 ? (s / 60).toFixed(1) + " min" : (s / 3600).toFixed(1) + " h";
}
const stateCell = (state) => el("span", state, "state state-" + state);

function notice(message) { $("notice").textContent = message || ""; }

// -- sign in ---------------------------------------------------------------------------------

function signOut(message) {
  localStorage.removeItem("qlactors-token");
  token = null;
  stopLog();
  $("app").hidden = true; $("sign-out").hidden = true; $("sign-in").hidden = false;
  $("sign-in-error").textContent = message || "";
}

async function signIn(candidate) {
  token = candidate;
  try {
    await api("GET", "/status");
  } catch (err) {
    signOut(err.message);
    return;
  }
  localStorage.setItem("qlactors-token", candidate);
  $("sign-in").hidden = true; $("app").hidden = false; $("sign-out").hidden = false;
  openLinked();
  refresh();
}

function openLinked() {  // a notification's link: the page at #run=ID
  const linked = /^#run=([A-Za-z0-9_-]{1,64})$/.exec(location.hash);
  if (linked) openRun = linked[1];
}

// -- status, tasks, runs ---------------------------------------------------------------------

async function loadStatus() {
  const s = await api("GET", "/status");
  $("profile").textContent = s.profile === "cluster" ? "cluster: " + s.database : "edge: " + s.home;
  const box = $("status");
  box.replaceChildren();
  const fact = (label, value, bad) => { const span = el("span", label + ": " + value, bad ? "error" : ""); box.appendChild(span); };
  if (s.profile === "cluster") {
    fact("replicas up", s.replicas.filter((r) => r.up).length + " of " + s.replicas.length, !s.up);
    fact("workers", s.workers.map((w) => w.worker_id + " (" + (w.status ?? w.state ?? "?") + ")").join(", ") || "none");
  } else {
    fact("runtime", s.up ? "up (pid " + s.pid + ")" : "down", !s.up);
    fact("quarantined receipts", s.quarantined_receipts, s.quarantined_receipts > 0);
    if (s.disk_reserve_hold) fact("disk reserve", "holding new attempts: " + s.disk_reserve_hold.free_bytes + " bytes free", true);
  }
  const active = Object.entries(s.active_runs).map(([k, v]) => k + " " + v).join(", ");
  fact("active runs", active || "none");
  fact("waiting recoveries", s.unresolved_recoveries.length, s.unresolved_recoveries.length > 0);
}

let shownTasks = "", shownRuns = "";  // what is on screen: a refresh that changes nothing redraws nothing

async function loadTasks() {
  const tasks = await api("GET", "/tasks");
  const signature = JSON.stringify(tasks);
  if (signature === shownTasks) return;
  shownTasks = signature;
  const body = $("tasks").tBodies[0];
  body.replaceChildren();
  $("no-tasks").hidden = tasks.length > 0;
  const filter = $("filter-task");
  const chosen = filter.value;
  filter.replaceChildren(el("option", "all"));
  filter.firstChild.value = "";
  for (const t of tasks) {
    const option = el("option", t.name); option.value = t.name; filter.appendChild(option);
    const schedule = t.schedule ? t.schedule.in_words || t.trigger.cron : "on demand";
    const next = t.schedule && t.enabled ? t.schedule.next_fires_ms.map(when).join(", ") : "";
    const last = t.last_run ? stateCell(t.last_run.state) : el("span", "never run", "muted");
    const toggle = el("input"); toggle.type = "checkbox"; toggle.checked = t.enabled;
    toggle.setAttribute("aria-label", "enabled " + t.name);
    toggle.addEventListener("change", () => act(() => api("POST", "/tasks/" + encodeURIComponent(t.name) + (toggle.checked ? "/enable" : "/disable"))));
    const run = el("button", "Run now"); run.dataset.task = t.name; run.className = "run-now";
    run.addEventListener("click", () => act(async () => { const r = await api("POST", "/tasks/" + encodeURIComponent(t.name) + "/runs"); showRun(r.id); }));
    const name = el("div"); name.append(el("strong", t.name), " ", run);  // the button stays in view on a phone
    const tr = row([name, schedule, next, last, toggle]);
    tr.dataset.task = t.name;
    body.appendChild(tr);
  }
  filter.value = chosen;
}

function runsQuery(cursor) {
  const q = new URLSearchParams({ limit: "50" });
  if ($("filter-task").value) q.set("task", $("filter-task").value);
  if ($("filter-state").value) q.set("state", $("filter-state").value);
  if (cursor) q.set("cursor", cursor);
  return "/runs?" + q;
}

function runRow(r) {
  const a = r.last_attempt;
  const tr = row([r.id.slice(-12), r.task, stateCell(r.state), a?.exit_code ?? "", when(r.started_at_ms),
                  duration(r.started_at_ms, r.finished_at_ms)]);
  tr.className = "clickable"; tr.dataset.run = r.id; tr.dataset.state = r.state;
  tr.addEventListener("click", () => showRun(r.id));
  return tr;
}

async function loadRuns() {
  const query = runsQuery();
  const page = await api("GET", query);
  const signature = query + JSON.stringify(page);
  if (signature === shownRuns) return;
  shownRuns = signature;
  $("runs").tBodies[0].replaceChildren(...page.runs.map(runRow));
  olderCursor = page.next_cursor;
  $("more-runs").hidden = !olderCursor;
}

async function olderRuns() {
  const page = await api("GET", runsQuery(olderCursor));
  $("runs").tBodies[0].append(...page.runs.map(runRow));
  olderCursor = page.next_cursor;
  $("more-runs").hidden = !olderCursor;
}

// -- one run ---------------------------------------------------------------------------------

async function showRun(id) {
  openRun = id;
  if (followed !== id) {  // decided before any await: two refreshes never follow one log twice
    stopLog();
    $("log").textContent = ""; $("log-note").textContent = "";
    followed = id;
    followLog(id);
  }
  $("run-section").hidden = false;
  const r = await api("GET", "/runs/" + encodeURIComponent(id));
  $("run-id").textContent = r.id;
  const facts = $("run-facts");
  facts.replaceChildren();
  const last = r.attempts[r.attempts.length - 1];
  for (const [k, v] of [["task", r.task + " (revision " + r.task_revision + ")"], ["state", stateCell(r.state)],
                        ["exit code", last?.exit_code ?? ""], ["started", when(r.started_at_ms)],
                        ["duration", duration(r.started_at_ms, r.finished_at_ms)], ["trigger", r.trigger_type],
                        ["error", r.error_code ?? ""], ["cancel", r.cancel_reason ?? ""]]) {
    facts.appendChild(el("dt", k));
    const dd = el("dd"); if (v instanceof Node) dd.appendChild(v); else dd.textContent = v; facts.appendChild(dd);
  }
  facts.dataset.state = r.state;
  const terminal = TERMINAL.includes(r.state);
  $("cancel-run").disabled = terminal; $("retry-run").disabled = !terminal;
  $("attempts").tBodies[0].replaceChildren(...r.attempts.map((a) => row([
    a.number, stateCell(a.state), a.exit_code ?? "", a.worker_id ?? "", when(a.started_at_ms),
    duration(a.started_at_ms, a.finished_at_ms), a.error_code ?? ""])));
  $("events").tBodies[0].replaceChildren(...r.events.map((e) => row([
    e.seq, e.type, when(e.at_ms), e.actor_name ? e.actor_type + " (" + e.actor_name + ")" : e.actor_type])));
}

function stopLog() { if (logStream) { logStream.abort(); logStream = null; } followed = null; }

function appendLog(bytes) {
  const pre = $("log");
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  let shown = pre.textContent + logDecoder.decode(bytes, { stream: true });
  if (shown.length > LOG_CAP) {
    shown = shown.slice(shown.length - LOG_CAP);
    $("log-note").textContent = "(the last " + LOG_CAP / 1024 + " KiB)";
  }
  pre.textContent = shown;
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

// Server-Sent Events over fetch (EventSource cannot send the Authorization header). One attempt's
// log at a time, from attempt 1: when an attempt ends and its run goes on (a lost run retried),
// the next attempt's log follows.
async function followLog(id) {
  const control = new AbortController();
  logStream = control;
  let offset = 0, attempt = 1;
  logDecoder = new TextDecoder();
  $("log").dataset.complete = "false";
  $("log-note").textContent = "(following)";
  while (!control.signal.aborted) {
    try {
      const answer = await fetch(API + "/runs/" + encodeURIComponent(id) + "/logs/stream?attempt=" + attempt +
                                 "&offset=" + offset, { headers: { "Authorization": "Bearer " + token }, signal: control.signal });
      if (answer.status === 404 && attempt > 1) {  // no next attempt yet; or none will come
        const run = await api("GET", "/runs/" + encodeURIComponent(id));
        if (TERMINAL.includes(run.state)) {
          $("log-note").textContent = ""; $("log").dataset.complete = "true";
          if (logStream === control) logStream = null;
          return;
        }
        throw new Error("the next attempt is not there yet");
      }
      if (!answer.ok) { $("log-note").textContent = "(no log: " + answer.status + ")"; return; }
      const reader = answer.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
          let kind = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) kind = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
          }
          if (!data) continue;
          const event = JSON.parse(data);
          if (kind === "log") {
            appendLog(Uint8Array.from(atob(event.base64), (c) => c.charCodeAt(0)));
            offset = event.end;
          } else if (kind === "end") {
            if (!TERMINAL.includes(event.state)) {  // the run goes on in its next attempt
              attempt = event.attempt + 1; offset = 0;
              appendLog(new TextEncoder().encode("\n--- attempt " + attempt + " ---\n"));
              break;
            }
            $("log-note").textContent = event.complete === false ? "(the rest of the log never arrived)" : "";
            $("log").dataset.complete = "true";
            if (logStream === control) logStream = null;
            return;
          }
        }
      }
    } catch (err) {
      if (control.signal.aborted) return;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));  // the stream broke: resume from offset
  }
}

// -- actions and refresh ---------------------------------------------------------------------

async function act(change) {
  notice("");
  try { await change(); } catch (err) { notice(err.message); }
  refresh();
}

async function refresh() {
  if (!token) return;
  try {
    await Promise.all([loadStatus(), loadTasks(), loadRuns()]);
    if (openRun) await showRun(openRun);
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return;
    notice(err.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (e) => { e.preventDefault(); signIn($("token-input").value.trim()); });
  $("sign-out").addEventListener("click", () => signOut(""));
  $("filter-task").addEventListener("change", loadRuns);
  $("filter-state").addEventListener("change", loadRuns);
  $("more-runs").addEventListener("click", olderRuns);
  $("close-run").addEventListener("click", () => { stopLog(); openRun = null; $("run-section").hidden = true; });
  $("cancel-run").addEventListener("click", () => act(() => api("POST", "/runs/" + encodeURIComponent(openRun) + "/cancel")));
  $("retry-run").addEventListener("click", () => act(async () => { const r = await api("POST", "/runs/" + encodeURIComponent(openRun) + "/retry"); openRun = r.id; }));
  window.addEventListener("hashchange", () => { openLinked(); if (token) refresh(); });
  if (token) signIn(token); else signOut("");
  setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
});
