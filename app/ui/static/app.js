// outboxq dashboard: hash-routed pages over the /v1 HTTP API. The token lives in sessionStorage only.
"use strict";

const STATUSES = ["waiting", "queued", "running", "retrying", "done", "dead", "cancelled"];
const view = document.getElementById("view");
const flash = document.getElementById("flash");

function token() { return sessionStorage.getItem("outboxq_token"); }

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}

function say(message, isError = false) {
  flash.textContent = message;
  flash.className = isError ? "error" : "";
}

// Each route() starts a new render; a read answered after a newer render began is dropped ("stale"), so a slow
// answer for the page the reader left (or a live refresh of it) never paints over the page they went to.
let renderSeq = 0;

// The API is beside the dashboard: at the root for `outboxq serve`, under the prefix a user's app included
// outboxq's router at (/outboxq/ui/ calls /outboxq/v1/...).
const API_BASE = location.pathname.replace(/\/ui\/[^/]*$/, "");

// An action's own reads (the count its confirmation shows) pass keepIfStale: a refresh never cancels what the
// reader clicked.
async function api(method, path, body, keepIfStale = false) {
  const started = renderSeq;
  const headers = {"Authorization": "Bearer " + token()};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method === "POST") headers["Idempotency-Key"] = crypto.randomUUID ? crypto.randomUUID() : String(Math.random());
  const response = await fetch(API_BASE + path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
  const data = response.status === 204 ? null : await response.json().catch(() => null);
  if (response.status === 401) { sessionStorage.removeItem("outboxq_token"); route(); throw new Error("signed out"); }
  if (!response.ok) throw new Error((data && data.error && data.error.message) || response.statusText);
  if (method === "GET" && !keepIfStale && started !== renderSeq) throw new Error("stale");
  return data;
}

function items(data) { return Array.isArray(data) ? data : (data.items || data.queues || []); }

function statusBadge(status) { return `<span class="status ${esc(status)}">${esc(status)}</span>`; }

// A time as people read it ("3 min ago", "in 20 s"), the exact UTC time on hover.
function when(iso) {
  if (!iso) return "";
  const seconds = Math.round((Date.parse(iso) - Date.now()) / 1000), size = Math.abs(seconds);
  const [n, unit] = size < 60 ? [size, "s"] : size < 3600 ? [Math.round(size / 60), "min"]
    : size < 86400 ? [Math.round(size / 3600), "h"] : [Math.round(size / 86400), "d"];
  const text = size < 2 ? "now" : seconds < 0 ? `${n} ${unit} ago` : `in ${n} ${unit}`;
  return `<time datetime="${esc(iso)}" title="${esc(new Date(iso).toISOString())}">${text}</time>`;
}

// Actions under way: the live refresh waits for them, so it never repaints a page an action is about to.
let acting = 0;
async function whileActing(work) {
  acting += 1;
  try { return await work(); } finally { acting -= 1; }
}

async function act(label, method, path, after) {
  if (!window.confirm(`${label}?`)) return;
  await whileActing(() => actNow(label, method, path, after));
}

async function actNow(label, method, path, after) {
  try {
    const result = await api(method, path);
    say(`${label}: done` + (result && result.retried !== undefined ? ` (${result.retried} jobs)` : ""));
    if (after) await after(result);
  } catch (error) {
    say(`${label} failed: ${error.message}`, true);
  }
}

// ---------------------------------------------------------------- sign-in

function showSignIn() {
  view.innerHTML = document.getElementById("sign-in-template").innerHTML;
  document.getElementById("sign-in-form").addEventListener("submit", async event => {
    event.preventDefault();
    sessionStorage.setItem("outboxq_token", document.getElementById("token").value.trim());
    sessionStorage.removeItem("outboxq_scopes");
    try {
      await api("GET", "/v1/queues");
      route();
    } catch (error) {
      sessionStorage.removeItem("outboxq_token");
      showSignIn();
      document.getElementById("sign-in-error").textContent = "That token was refused.";
    }
  });
}

// ---------------------------------------------------------------- queues

function chart(points) {
  const width = 600, height = 80, barWidth = width / Math.max(points.length, 1);
  const max = Math.max(1, ...points.map(p => p.done + p.failed));
  const bars = points.map((p, i) => {
    const doneHeight = height * p.done / max, failedHeight = height * p.failed / max;
    return `<rect class="done" x="${i * barWidth}" y="${height - doneHeight}" width="${barWidth - 1}" height="${doneHeight}"><title>${esc(p.minute)}: ${p.done} done</title></rect>` +
           `<rect class="failed" x="${i * barWidth}" y="${height - doneHeight - failedHeight}" width="${barWidth - 1}" height="${failedHeight}"><title>${p.failed} failed</title></rect>`;
  }).join("");
  return `<svg class="chart" id="throughput-chart" viewBox="0 0 ${width} ${height}" width="100%" height="${height}">${bars}</svg>`;
}

// Flow control: a queue's limits and their use now, in one line ("none" for an unlimited queue).
function limitsText(l) {
  if (!l) return "none";
  const parts = [l.global_concurrency === null ? `${l.running} running` : `${l.running} running, limit ${l.global_concurrency}`];
  if (l.rate_limit) parts.push(`${l.recent_starts} starts in the window, limit ${l.rate_limit}`);
  if (l.per_key) parts.push("limits per key" + (l.busiest_keys.length ? "; busiest " + l.busiest_keys.map(k => `${k.key}: ${k.running}`).join(", ") : ""));
  return parts.join("; ");
}

// Change a queue's limits at run time (PUT /v1/queues/{queue}/limits): an empty answer removes a limit; what
// is not a number goes to the API as typed, so its message says what to fix.
async function changeLimits(queue, current, after = showQueues) {
  const concurrency = window.prompt(`Global concurrency of ${queue} (a number; empty for none)`,
    current && current.global_concurrency !== null ? String(current.global_concurrency) : "");
  if (concurrency === null) return;
  const rate = window.prompt(`Rate limit of ${queue} (N/s, N/m or N/h; empty for none)`, (current && current.rate_limit) || "");
  if (rate === null) return;
  const typed = concurrency.trim();
  const body = {global_concurrency: typed === "" ? null : (/^\d+$/.test(typed) ? Number(typed) : typed), rate_limit: rate.trim() || null};
  try {
    await api("PUT", `/v1/queues/${encodeURIComponent(queue)}/limits`, body);
    say(`Limits of ${queue}: changed`);
    await after();
  } catch (error) {
    say(`Limits of ${queue} failed: ${error.message}`, true);
  }
}

async function showQueues() {
  const [queuesData, health, throughputData] = await Promise.all([
    api("GET", "/v1/queues"), api("GET", "/v1/health"), api("GET", "/v1/stats/throughput?minutes=60"),
  ]);
  const queues = items(queuesData), throughput = items(throughputData);
  const done = throughput.reduce((n, p) => n + p.done, 0), failed = throughput.reduce((n, p) => n + p.failed, 0);
  const failureRate = done + failed ? (100 * failed / (done + failed)).toFixed(1) : "0.0";
  const rows = queues.map(q => `
    <tr data-queue="${esc(q.queue)}">
      <td><a href="#/queues/${encodeURIComponent(q.queue)}">${esc(q.queue)}</a></td>
      <td>${statusBadge(q.state || (q.paused ? "paused" : "running"))}</td>
      ${STATUSES.map(s => `<td class="num">${(q.counts || {})[s] || 0}</td>`).join("")}
      <td class="limits">${esc(limitsText(q.limits))}</td>
      <td>
        <button class="secondary" data-action="limits">Limits</button>
        <button class="secondary" data-action="${q.paused ? "resume" : "pause"}">${q.paused ? "Resume" : "Pause"}</button>
        <button class="danger" data-action="retry">Retry errors</button>
      </td>
    </tr>`).join("");
  view.innerHTML = `
    <section class="card">
      <h2>Health: <span id="health" class="${health.healthy ? "healthy" : "unhealthy"}">${health.healthy ? "healthy" : "unhealthy"}</span></h2>
      ${(health.queues_in_error || []).map(q => `<p class="error">${esc(q.queue)} in error since ${when(q.failing_since)}</p>`).join("")}
      <h3>Last hour: ${done} done, ${failed} failed attempts (failure rate ${failureRate}%)</h3>
      ${chart(throughput)}
    </section>
    <section class="card">
      <h2>Queues</h2>
      <p class="note" id="finished-window">done, dead and cancelled: jobs finished in the last ${(queuesData.finished_window_s || 0) / 3600} h</p>
      <table id="queues"><thead><tr><th>queue</th><th>state</th>${STATUSES.map(s => `<th>${s}</th>`).join("")}<th>limits</th><th><span class="visually-hidden">actions</span></th></tr></thead>
      <tbody>${rows || `<tr><td colspan="11">No queues yet.</td></tr>`}</tbody></table>
    </section>`;
  view.querySelectorAll("tr[data-queue] button").forEach(button => {
    const queue = button.closest("tr").dataset.queue, action = button.dataset.action;
    if (action === "limits") {
      button.addEventListener("click", () => changeLimits(queue, (queues.find(q => q.queue === queue) || {}).limits));
      return;
    }
    const labels = {pause: `Pause queue ${queue}`, resume: `Resume queue ${queue}`, retry: `Retry all errors of ${queue}`};
    button.addEventListener("click", () => act(labels[action], "POST", `/v1/queues/${encodeURIComponent(queue)}/${action}`, showQueues));
  });
}

// ---------------------------------------------------------------- limits

// Every queue's flow control: its limits, who set them, and their use now; each editable (changeLimits).
async function showLimits() {
  const queues = items(await api("GET", "/v1/queues"));
  const cell = value => value === null || value === undefined ? "none" : esc(value);
  const rows = queues.map(q => {
    const l = q.limits;
    return `<tr data-queue="${esc(q.queue)}"><td><a href="#/queues/${encodeURIComponent(q.queue)}">${esc(q.queue)}</a></td>
      <td>${statusBadge(q.state || "idle")}</td><td class="num">${l ? cell(l.global_concurrency) : "none"}</td><td>${l ? cell(l.rate_limit) : "none"}</td>
      <td>${l && l.per_key ? "per key" : "whole queue"}</td><td>${l ? esc(l.source) : ""}</td><td class="num">${l ? l.running : (q.counts || {}).running || 0}</td>
      <td class="num">${l ? l.recent_starts : ""}</td><td>${l ? esc(l.busiest_keys.map(k => `${k.key}: ${k.running}`).join(", ")) : ""}</td>
      <td><button class="secondary" data-action="limits">Edit</button></td></tr>`;
  }).join("");
  view.innerHTML = `
    <section class="card"><h2>Limits</h2>
    <table id="limits"><thead><tr><th>queue</th><th>state</th><th>concurrency</th><th>rate</th><th>applies to</th><th>set by</th>
      <th>running</th><th>starts in the rate window</th><th>busiest keys</th><th><span class="visually-hidden">actions</span></th></tr></thead>
    <tbody>${rows || `<tr><td colspan="10">No queues yet.</td></tr>`}</tbody></table></section>`;
  view.querySelectorAll("tr[data-queue] button[data-action='limits']").forEach(button => {
    const queue = button.closest("tr").dataset.queue;
    button.addEventListener("click", () => changeLimits(queue, (queues.find(q => q.queue === queue) || {}).limits, showLimits));
  });
}

// ---------------------------------------------------------------- a queue's jobs

// A queue's day of processing times and retries reads a day of its finished jobs: a live refresh reuses what
// was read within DAY_FIGURES_MS, so an open queue page costs the database a day's read twice a minute, not
// every two seconds; opening the page reads them afresh.
const DAY_FIGURES_MS = 30000, dayFiguresRead = new Map();
async function dayFigures(name) {
  const kept = dayFiguresRead.get(name);
  if (refreshing && kept && Date.now() - kept.at < DAY_FIGURES_MS) return kept.figures;
  const figures = await Promise.all([api("GET", `/v1/stats/processing-time?queue=${name}`),
    api("GET", `/v1/stats/retries?queue=${name}`)]);
  dayFiguresRead.set(name, {at: Date.now(), figures});
  return figures;
}

async function showQueue(queue, params) {
  const status = params.get("status") || "", marker = params.get("marker") || "";
  const query = new URLSearchParams({limit: "50"});
  if (status) query.set("status", status);
  if (marker) query.set("marker", marker);
  const name = encodeURIComponent(queue);
  const [page, info, throughput, [times, retries]] = await Promise.all([
    api("GET", `/v1/queues/${name}/jobs?${query}`), api("GET", `/v1/queues/${name}`),
    api("GET", `/v1/stats/throughput?minutes=60&queue=${name}`), dayFigures(name)]);
  const time = items(times)[0] || {}, retry = items(retries)[0] || {};
  const ms = value => value == null ? "–" : `${Math.round(value)} ms`;
  const rows = page.items.map(j => `
    <tr><td><a href="#/jobs/${j.id}">${j.id}</a></td><td>${esc(j.key)}</td><td>${statusBadge(j.status)}</td>
    <td class="num">${j.attempts}</td><td>${when(j.created_at)}</td><td>${esc(j.last_error)}</td></tr>`).join("");
  const base = `#/queues/${encodeURIComponent(queue)}?status=${encodeURIComponent(status)}`;
  view.innerHTML = `
    <section class="card">
      <h2>Queue ${esc(queue)}</h2>
      <div class="toolbar">
        <label>Status <select id="status-filter"><option value="">all</option>
          ${STATUSES.map(s => `<option ${s === status ? "selected" : ""}>${s}</option>`).join("")}</select></label>
        ${marker ? `<a href="${base}">First page</a>` : ""}
        ${page.next_marker ? `<a id="next-page" href="${base}&marker=${encodeURIComponent(page.next_marker)}">Next page</a>` : ""}
      </div>
      <table id="jobs"><thead><tr><th>id</th><th>key</th><th>status</th><th>attempts</th><th>created</th><th>last error</th></tr></thead>
      <tbody>${rows || `<tr><td colspan="6">No jobs.</td></tr>`}</tbody></table>
    </section>
    <section class="card" id="queue-figures">
      <h2>Last hour and day</h2>
      <p>State ${statusBadge(info.state || "idle")} · lag <span id="queue-lag">${(info.lag_s ?? 0).toFixed(1)} s</span> (the oldest ready job's wait)</p>
      ${chart(items(throughput))}
      <table id="queue-times"><thead><tr><th>processing time (a day, successful attempts)</th><th>p50</th><th>p90</th><th>p95</th><th>p99</th><th>max</th></tr></thead>
      <tbody><tr><td>${time.jobs ?? 0} jobs</td><td>${ms(time.p50_ms)}</td><td>${ms(time.p90_ms)}</td><td>${ms(time.p95_ms)}</td><td>${ms(time.p99_ms)}</td><td>${ms(time.max_ms)}</td></tr></tbody></table>
      <p id="queue-retries">A day: ${retry.finished ?? 0} finished, ${retry.ok ?? 0} done, ${retry.dead ?? 0} dead, ${retry.retries ?? 0} retries.</p>
    </section>`;
  document.getElementById("status-filter").addEventListener("change", event => {
    location.hash = `#/queues/${encodeURIComponent(queue)}?status=${encodeURIComponent(event.target.value)}`;
  });
}

// ---------------------------------------------------------------- a job

async function showJob(id) {
  const [job, errors, dependencies] = await Promise.all([
    api("GET", `/v1/jobs/${id}`), api("GET", `/v1/jobs/${id}/errors`), api("GET", `/v1/jobs/${id}/dependencies`),
  ]);
  const errorItems = items(errors);
  const related = list => list.length ? `<ul>${list.map(j => `<li><a href="#/jobs/${j.id}">${j.id}</a> ${esc(j.queue)} ${esc(j.key)} ${statusBadge(j.status)}</li>`).join("")}</ul>` : "<p>none</p>";
  view.innerHTML = `
    <section class="card">
      <h2>Job ${job.id} <span id="job-status">${statusBadge(job.status)}</span></h2>
      <div class="toolbar">
        <button id="retry-job">Retry now</button>
        <button class="danger" id="cancel-job">Cancel</button>
        <a href="#/queues/${encodeURIComponent(job.queue)}">queue ${esc(job.queue)}</a>
        ${job.workflow_id ? `<a id="job-workflow" href="#/workflows/${job.workflow_id}">workflow ${job.workflow_id}, step ${esc(job.step)}</a>` : ""}
        ${job.sequence ? `<span id="job-sequence">sequence ${esc(job.sequence)}</span>` : ""}
      </div>
      <table>
        <tr><th>key</th><td>${esc(job.key)}</td><th>priority</th><td>${job.priority}</td></tr>
        <tr><th>attempts</th><td id="job-attempts">${job.attempts} of ${job.max_attempts ?? "default"}</td><th>run at</th><td>${when(job.run_at)}</td></tr>
        <tr><th>created</th><td>${when(job.created_at)}</td><th>started</th><td>${when(job.started_at)}</td></tr>
        <tr><th>finished</th><td>${when(job.finished_at)}</td><th>last error</th><td>${esc(job.last_error)}</td></tr>
        ${job.waiting_reason ? `<tr><th>waiting because</th><td colspan="3" id="job-waiting-reason">${esc(job.waiting_reason)}</td></tr>` : ""}
        <tr><th>progress</th><td id="job-progress">${job.progress == null ? "" : `${Math.round(job.progress * 100)}% ${esc(job.progress_message)}`}</td><th>snoozes</th><td>${job.snoozes ?? 0}</td></tr>
      </table>
      <h3>Payload</h3><pre id="payload">${esc(JSON.stringify(job.payload, null, 2))}</pre>
      ${job.result == null ? "" : `<h3>Result</h3><pre id="result">${esc(JSON.stringify(job.result, null, 2))}</pre>`}
      <h3>Waits for</h3>${related(dependencies.depends_on || [])}
      <h3>Waited for by</h3>${related(dependencies.dependents || [])}
      <h3>Timeline</h3>
      <ol id="timeline" class="timeline">${timeline(job, errorItems).map(t => `
        <li class="event ${esc(t.kind)}"><span class="when">${when(t.at)}</span> <strong>${esc(t.what)}</strong>${t.worker ? ` on <code>${esc(t.worker)}</code>` : ""}
        ${t.error ? `<div class="error-text">${esc(t.error)}</div>` : ""}
        ${t.traceback ? `<details><summary>stack</summary><pre>${esc(t.traceback)}</pre></details>` : ""}</li>`).join("")}</ol>
    </section>`;
  document.getElementById("retry-job").addEventListener("click", () => act(`Retry job ${id}`, "POST", `/v1/jobs/${id}/retry`, () => showJob(id)));
  document.getElementById("cancel-job").addEventListener("click", () => act(`Cancel job ${id}`, "POST", `/v1/jobs/${id}/cancel`, () => showJob(id)));
}

// A job's life as events, oldest first: enqueued; each attempt that failed or snoozed (with its worker, error
// and stack, from the job's history); the latest attempt's start and worker; how it ended or when it runs next.
function timeline(job, history) {
  const events = [{at: job.created_at, kind: "enqueued", what: "enqueued"}];
  for (const e of history) {
    events.push({at: e.failed_at, kind: e.kind, worker: e.worker_id, error: e.error, traceback: e.traceback,
                 what: e.kind === "snooze" ? `attempt ${e.attempt} snoozed` : `attempt ${e.attempt} failed`});
  }
  if (job.attempt_started_at && job.attempts > 0) {
    events.push({at: job.attempt_started_at, kind: "started", worker: job.worker_id, what: `attempt ${job.attempts} started`});
  }
  const ends = {done: "done", dead: "dead: out of attempts", cancelled: "cancelled"};
  if (ends[job.status] && job.finished_at) events.push({at: job.finished_at, kind: job.status, what: ends[job.status]});
  if (job.status === "retrying") events.push({at: job.run_at, kind: "retrying", what: `attempt ${job.attempts + 1} due`});
  return events.sort((a, b) => Date.parse(a.at) - Date.parse(b.at));
}

// ---------------------------------------------------------------- search across queues

// The search box's qualifiers (queue:, status:, key:, error:, payload.a.b:value, since:, until:) as
// GET /v1/jobs parameters; a word without a qualifier searches the last error. Quoted values may hold spaces.
function searchParams(text) {
  const params = new URLSearchParams(), payload = {};
  for (const [, name, quoted, bare] of text.matchAll(/(?:([\w.]+):)?(?:"([^"]*)"|(\S+))/g)) {
    const value = quoted ?? bare;
    if (!name) params.set("error", value);
    else if (name === "status") value.split(",").forEach(s => params.append("status", s));
    else if (name.startsWith("payload.")) {
      const path = name.split(".").slice(1);
      let node = payload;
      path.slice(0, -1).forEach(part => { node = node[part] = node[part] || {}; });
      node[path[path.length - 1]] = /^(-?\d+(\.\d+)?|true|false|null)$/.test(value) ? JSON.parse(value) : value;
    } else params.set(name, value);
  }
  if (Object.keys(payload).length) params.set("payload", JSON.stringify(payload));
  return params;
}

async function showSearch(params) {
  const text = params.get("q") || "", marker = params.get("marker") || "";
  const query = searchParams(text);
  query.set("limit", "50");
  if (marker) query.set("marker", marker);
  const page = await api("GET", `/v1/jobs?${query}`);
  const rows = page.items.map(j => `
    <tr><td><input type="checkbox" class="pick" value="${j.id}" aria-label="select job ${j.id}"></td>
    <td><a href="#/jobs/${j.id}">${j.id}</a></td><td><a href="#/queues/${encodeURIComponent(j.queue)}">${esc(j.queue)}</a></td>
    <td>${esc(j.key)}</td><td>${statusBadge(j.status)}</td><td class="num">${j.attempts}</td><td>${when(j.created_at)}</td><td>${esc(j.last_error)}</td></tr>`).join("");
  const here = `#/jobs?q=${encodeURIComponent(text)}`;
  view.innerHTML = `
    <section class="card">
      <h2>Search jobs</h2>
      <form id="search-form" class="toolbar">
        <input id="search" type="search" size="60" value="${esc(text)}" aria-label="search"
          placeholder='queue:mail status:dead key:order- payload.customer:acme error:"timed out"'>
        <button type="submit">Search</button>
      </form>
      <div class="toolbar">
        <button id="retry-selected" class="secondary">Retry selected</button>
        <button id="cancel-selected" class="danger">Cancel selected</button>
        <button id="retry-matching" class="secondary">Retry all matching</button>
        <button id="cancel-matching" class="danger">Cancel all matching</button>
        ${marker ? `<a href="${here}">First page</a>` : ""}
        ${page.next_marker ? `<a id="next-results" href="${here}&marker=${encodeURIComponent(page.next_marker)}">Next page</a>` : ""}
      </div>
      <table id="search-results" data-q="${esc(text)}"><thead><tr><th><span class="visually-hidden">select</span></th><th>id</th><th>queue</th><th>key</th><th>status</th><th>attempts</th><th>created</th><th>last error</th></tr></thead>
      <tbody>${rows || `<tr><td colspan="8">No job matches.</td></tr>`}</tbody></table>
    </section>`;
  document.getElementById("search-form").addEventListener("submit", event => {
    event.preventDefault();
    location.hash = `#/jobs?q=${encodeURIComponent(document.getElementById("search").value.trim())}`;
  });
  const bulk = action => whileActing(async () => {
    const ids = [...view.querySelectorAll("input.pick:checked")].map(box => Number(box.value));
    if (!ids.length) return say("Select jobs first.", true);
    if (!window.confirm(`${action === "retry" ? "Retry" : "Cancel"} ${ids.length} job${ids.length === 1 ? "" : "s"}?`)) return;
    try {
      const result = await api("POST", `/v1/jobs/${action}`, {ids});
      say(`${action === "retry" ? "Retried" : "Cancelled"} ${result.count} of ${ids.length} jobs`);
      await showSearch(params);
    } catch (error) {
      say(`${action} failed: ${error.message}`, true);
    }
  });
  // Over the whole filter: the confirmation says how many jobs match (counted up to what one call changes).
  const bulkMatching = action => whileActing(async () => {
    const filterQuery = searchParams(text), filter = {};
    for (const name of ["queue", "key", "error", "since", "until"]) if (filterQuery.get(name)) filter[name] = filterQuery.get(name);
    if (filterQuery.getAll("status").length) filter.status = filterQuery.getAll("status");
    if (filterQuery.get("payload")) filter.payload = JSON.parse(filterQuery.get("payload"));
    try {
      const counted = await api("GET", `/v1/jobs/count?${filterQuery}`, undefined, true);
      const many = `${counted.count.toLocaleString("en")}${counted.more ? "+" : ""}`;
      const verb = action === "retry" ? "Retry" : "Cancel";
      if (!window.confirm(`${verb} ${many} job${counted.count === 1 ? "" : "s"} matching ${text ? `"${text}"` : "everything"}?` +
                          (counted.more ? " (10,000 a click: click again for more)" : ""))) return;
      const result = await api("POST", `/v1/jobs/${action}`, {filter, all: Object.keys(filter).length === 0});
      say(`${action === "retry" ? "Retried" : "Cancelled"} ${result.count} of ${many} matching jobs`);
      await showSearch(params);
    } catch (error) {
      say(`${action} failed: ${error.message}`, true);
    }
  });
  document.getElementById("retry-selected").addEventListener("click", () => bulk("retry"));
  document.getElementById("cancel-selected").addEventListener("click", () => bulk("cancel"));
  document.getElementById("retry-matching").addEventListener("click", () => bulkMatching("retry"));
  document.getElementById("cancel-matching").addEventListener("click", () => bulkMatching("cancel"));
}

// ---------------------------------------------------------------- workers and schedules

async function showWorkers() {
  const data = await api("GET", "/v1/workers");
  view.innerHTML = `
    <section class="card"><h2>Live workers</h2>
    <table id="workers"><thead><tr><th>id</th><th>host</th><th>pid</th><th>version</th><th>queues</th><th>concurrency</th><th>in flight</th><th>started</th><th>last seen</th></tr></thead>
    <tbody>${data.items.map(w => `<tr data-worker="${esc(w.id)}"><td>${esc(w.id)}</td><td>${esc(w.host)}</td><td class="num">${w.pid}</td><td>${esc(w.version)}</td>
      <td>${esc(w.queues.map(q => q.queue + (q.global_concurrency ? ` (≤${q.global_concurrency})` : "")).join(", "))}</td>
      <td class="num">${w.concurrency}</td><td class="num">${w.in_flight}</td><td>${when(w.started_at)}</td><td>${when(w.last_seen_at)}</td></tr>`).join("")
      || `<tr><td colspan="9">No live worker.</td></tr>`}</tbody></table></section>`;
}

async function showSchedules() {
  const data = await api("GET", "/v1/schedules");
  view.innerHTML = `
    <section class="card"><h2>Schedules</h2>
    <table id="schedules"><thead><tr><th>name</th><th>queue</th><th>when</th><th>time zone</th><th>missed</th><th>last slot</th><th>next slot</th><th>last job</th><th><span class="visually-hidden">actions</span></th></tr></thead>
    <tbody>${data.items.map(s => `<tr data-schedule="${esc(s.name)}"><td>${esc(s.name)}</td><td>${esc(s.queue)}</td>
      <td>${s.cron ? "cron " + esc(s.cron) : `every ${s.every_s} s`}</td><td>${esc(s.timezone)}</td><td>${esc(s.missed)}</td>
      <td>${when(s.last_slot)}</td><td>${s.paused ? statusBadge("paused") : when(s.next_slot)}</td>
      <td>${s.last_job_id ? `<a href="#/jobs/${s.last_job_id}">${s.last_job_id}</a> ${statusBadge(s.last_job_status)}` : ""}</td>
      <td><button class="secondary" data-action="run">Run now</button>
          <button class="secondary" data-action="${s.paused ? "resume" : "pause"}">${s.paused ? "Resume" : "Pause"}</button></td></tr>`).join("")
      || `<tr><td colspan="9">No schedules yet.</td></tr>`}</tbody></table></section>`;
  view.querySelectorAll("tr[data-schedule] button").forEach(button => {
    const name = button.closest("tr").dataset.schedule, action = button.dataset.action;
    const labels = {run: `Run schedule ${name} now`, pause: `Pause schedule ${name}`, resume: `Resume schedule ${name}`};
    button.addEventListener("click", () => act(labels[action], "POST", `/v1/schedules/${encodeURIComponent(name)}/${action}`, showSchedules));
  });
}

// ---------------------------------------------------------------- workflows

async function showWorkflows() {
  const page = await api("GET", "/v1/workflows?limit=50");
  view.innerHTML = `
    <section class="card"><h2>Workflows</h2>
    <table id="workflows"><thead><tr><th>id</th><th>name</th><th>status</th><th>steps</th><th>done</th><th>unfinished</th><th>dead</th><th>cancelled</th><th>created</th></tr></thead>
    <tbody>${page.items.map(w => `<tr><td><a href="#/workflows/${w.id}">${w.id}</a></td><td>${esc(w.name)}</td><td>${statusBadge(w.status)}</td>
      <td class="num">${w.steps}</td><td class="num">${w.done}</td><td class="num">${w.unfinished}</td><td class="num">${w.dead}</td><td class="num">${w.cancelled}</td>
      <td>${when(w.created_at)}</td></tr>`).join("") || `<tr><td colspan="9">No workflows yet.</td></tr>`}</tbody></table></section>`;
}

// The steps laid out by depth (a step one column right of the deepest step it comes after), edges as lines
// (dashed: an edge that runs its step even when the one before fails). Drawn up to MAX_DRAWN steps.
const MAX_DRAWN = 300;
function workflowGraph(steps) {
  const byName = new Map(steps.map(s => [s.name, s])), depth = new Map();
  const depthOf = name => {
    if (depth.has(name)) return depth.get(name);
    depth.set(name, 0);  // (a guard: the server refuses cycles)
    const step = byName.get(name);
    const d = step ? Math.max(0, ...step.after.filter(e => byName.has(e.step)).map(e => depthOf(e.step) + 1)) : 0;
    depth.set(name, d);
    return d;
  };
  steps.forEach(s => depthOf(s.name));
  const columns = [];
  steps.forEach(s => { const d = depth.get(s.name); (columns[d] = columns[d] || []).push(s); });
  const boxW = 130, boxH = 26, gapX = 60, gapY = 12, place = new Map();
  columns.forEach((column, x) => column.forEach((s, y) => place.set(s.name, {x: 10 + x * (boxW + gapX), y: 10 + y * (boxH + gapY)})));
  const width = 20 + columns.length * (boxW + gapX), height = 20 + Math.max(...columns.map(c => c.length)) * (boxH + gapY);
  const edges = steps.flatMap(s => s.after.filter(e => place.has(e.step)).map(e => {
    const from = place.get(e.step), to = place.get(s.name);
    return `<path class="edge ${e.on_failure === "run" ? "run" : ""}" d="M${from.x + boxW},${from.y + boxH / 2} C${from.x + boxW + gapX / 2},${from.y + boxH / 2} ${to.x - gapX / 2},${to.y + boxH / 2} ${to.x},${to.y + boxH / 2}"/>`;
  })).join("");
  const nodes = steps.map(s => { const p = place.get(s.name); return `
    <a href="#/jobs/${s.job_id}" class="${esc(s.status)}" data-step="${esc(s.name)}"><rect x="${p.x}" y="${p.y}" width="${boxW}" height="${boxH}"/>
    <text x="${p.x + 6}" y="${p.y + 17}">${esc(s.name.slice(0, 16))} · ${esc(s.status)}</text><title>${esc(s.name)}: ${esc(s.status)}</title></a>`; }).join("");
  return `<svg class="workflow-graph" id="workflow-graph" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}">${edges}${nodes}</svg>`;
}

async function showWorkflow(id) {
  const wf = await api("GET", `/v1/workflows/${id}`);
  view.innerHTML = `
    <section class="card">
      <h2>Workflow ${wf.id} ${esc(wf.name)} <span id="workflow-status">${statusBadge(wf.status)}</span></h2>
      <div class="toolbar">
        <button id="retry-workflow">Retry failed steps</button>
        <button class="danger" id="cancel-workflow">Cancel workflow</button>
      </div>
      ${wf.steps.length <= MAX_DRAWN ? workflowGraph(wf.steps) : `<p class="note">${wf.steps.length} steps: too many to draw; listed below.</p>`}
      <table id="workflow-steps"><thead><tr><th>step</th><th>job</th><th>queue</th><th>status</th><th>attempts</th><th>after</th><th>last error</th></tr></thead>
      <tbody>${wf.steps.map(s => `<tr><td>${esc(s.name)}</td><td><a href="#/jobs/${s.job_id}">${s.job_id}</a></td><td>${esc(s.queue)}</td>
        <td>${statusBadge(s.status)}</td><td class="num">${s.attempts}</td><td>${esc(s.after.map(e => e.step + (e.on_failure === "run" ? " (runs anyway)" : "")).join(", "))}</td>
        <td>${esc(s.last_error || s.waiting_reason)}</td></tr>`).join("")}</tbody></table>
    </section>`;
  document.getElementById("retry-workflow").addEventListener("click", () => act(`Retry the failed steps of workflow ${id}`, "POST", `/v1/workflows/${id}/retry`, () => showWorkflow(id)));
  document.getElementById("cancel-workflow").addEventListener("click", () => act(`Cancel workflow ${id}`, "POST", `/v1/workflows/${id}/cancel`, () => showWorkflow(id)));
}

// ---------------------------------------------------------------- spark

async function showSpark() {
  const [data, streamData] = await Promise.all([api("GET", "/v1/spark/batches"), api("GET", "/v1/spark/streams")]);
  const batches = items(data), streams = items(streamData);
  view.innerHTML = `
    <section class="card"><h2>Spark streaming queries</h2>
    <table id="spark-streams"><thead><tr><th>name</th><th>queue</th><th>application</th><th>state</th><th>where</th>
      <th>micro-batches</th><th>jobs read</th><th>lease renewals</th><th>ready jobs</th><th>last seen</th></tr></thead>
    <tbody>${streams.map(s => `<tr data-stream="${esc(s.name)}"><td>${esc(s.name)}</td><td><a href="#/queues/${encodeURIComponent(s.queue)}">${esc(s.queue)}</a></td>
      <td>${esc(s.application_id)}</td><td>${statusBadge(s.running ? "running" : "stopped")}</td><td>${esc(s.host)}:${s.pid}</td>
      <td class="num">${s.micro_batches}</td><td class="num">${s.jobs_read}</td><td class="num">${s.lease_renewals}</td>
      <td class="num">${s.lag}</td><td>${when(s.last_seen_at)}</td></tr>`).join("") || `<tr><td colspan="10">No streaming query has read outboxq yet.</td></tr>`}</tbody></table></section>
    <section class="card"><h2>Spark batches</h2>
    <table id="spark-batches"><thead><tr><th>id</th><th>queue</th><th>processor</th><th>state</th><th>jobs</th><th>rows written</th><th>error</th></tr></thead>
    <tbody>${batches.map(b => `<tr><td>${b.id}</td><td>${esc(b.queue)}</td><td>${esc(b.processor)}</td><td>${statusBadge(b.state)}</td>
      <td class="num">${b.jobs_claimed}</td><td class="num">${b.rows_written}</td><td>${esc(b.error)}</td></tr>`).join("") || `<tr><td colspan="7">No batches yet.</td></tr>`}</tbody></table></section>`;
}

// ---------------------------------------------------------------- routing

// A token without the admin scope sees every page with its actions disabled (the API would refuse them).
async function readOnly() {
  if (sessionStorage.getItem("outboxq_scopes") === null) {
    sessionStorage.setItem("outboxq_scopes", (await api("GET", "/v1/me")).scopes.join(","));
  }
  return !sessionStorage.getItem("outboxq_scopes").split(",").includes("admin");
}

function disableActions() {
  view.querySelectorAll("button").forEach(button => {
    if (button.closest("form")) return;  // (searching is reading)
    button.disabled = true;
    button.title = "needs a token with the admin scope";
  });
}

async function route() {
  renderSeq += 1;
  if (!token()) return showSignIn();
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query || "");
  const parts = (path || "/").split("/").filter(Boolean).map(decodeURIComponent);
  try {
    if (parts[0] === "queues" && parts[1]) await showQueue(parts[1], params);
    else if (parts[0] === "jobs" && parts[1]) await showJob(Number(parts[1]));
    else if (parts[0] === "jobs") await showSearch(params);
    else if (parts[0] === "workers") await showWorkers();
    else if (parts[0] === "limits") await showLimits();
    else if (parts[0] === "schedules") await showSchedules();
    else if (parts[0] === "workflows" && parts[1]) await showWorkflow(Number(parts[1]));
    else if (parts[0] === "workflows") await showWorkflows();
    else if (parts[0] === "spark") await showSpark();
    else await showQueues();
    if (await readOnly()) disableActions();
  } catch (error) {
    if (!["signed out", "stale"].includes(error.message)) view.innerHTML = `<p class="error">Could not load this page: ${esc(error.message)}</p>`;
  }
}

document.getElementById("sign-out").addEventListener("click", event => {
  event.preventDefault();
  sessionStorage.removeItem("outboxq_token");
  sessionStorage.removeItem("outboxq_scopes");
  say("");
  route();
});
window.addEventListener("hashchange", () => { say(""); route(); });

// Keyboard: "/" searches, "g" then a letter goes to a page, "?" lists the keys; never while typing in a field.
const GO_KEYS = {q: "#/", s: "#/jobs", w: "#/workers", l: "#/limits", c: "#/schedules", f: "#/workflows", k: "#/spark"};
const KEYS_HELP = `Keys: / search · g q queues · g s search · g w workers · g l limits · g c schedules · g f workflows · g k Spark · ? this help`;
let pendingGo = false;
document.addEventListener("keydown", event => {
  const target = event.target;
  if (event.ctrlKey || event.metaKey || event.altKey || (target && ["INPUT", "SELECT", "TEXTAREA"].includes(target.tagName))) return;
  if (pendingGo) {
    pendingGo = false;
    if (GO_KEYS[event.key]) { event.preventDefault(); location.hash = GO_KEYS[event.key]; }
    return;
  }
  if (event.key === "g") pendingGo = true;
  else if (event.key === "?") say(KEYS_HELP);
  else if (event.key === "/") {
    event.preventDefault();
    const focusSearch = () => { const box = document.getElementById("search"); if (box) box.focus(); };
    if (location.hash.startsWith("#/jobs") && !/^#\/jobs\/\d/.test(location.hash)) focusSearch();
    else { location.hash = "#/jobs"; setTimeout(function waitForBox() { document.getElementById("search") ? focusSearch() : setTimeout(waitForBox, 50); }, 50); }
  }
});

// Live: the page in view is read again every REFRESH_MS while updates are on (the button pauses them), the
// tab is visible, and the reader is not typing or holding a selection that a redraw would lose.
const REFRESH_MS = 2000;
let live = true, refreshing = false;
const liveToggle = document.getElementById("live-toggle");
liveToggle.addEventListener("click", () => {
  live = !live;
  liveToggle.textContent = live ? "Pause updates" : "Resume updates";
  liveToggle.setAttribute("aria-pressed", String(live));
});
setInterval(async () => {
  const busy = document.activeElement && ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement.tagName);
  if (!live || refreshing || acting || busy || document.hidden || !token() || view.querySelector("input.pick:checked")) return;
  refreshing = true;
  try { await route(); } finally { refreshing = false; }
}, REFRESH_MS);
route();
