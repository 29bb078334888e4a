// The idemgate operator console. Every action is a call of the gateway's own API with the admin
// token, exactly as curl would make it; the page keeps nothing but the token (in this tab's
// sessionStorage, never in a URL) and renders answers with textContent only.
"use strict";

const TOKEN_KEY = "idemgate-admin-token";
const $ = (id) => document.getElementById(id);

// The safety counters and gauges the Safety view shows, in this order, with what they mean.
const SAFETY = [
  ["idemgate_review_backlog", "operations waiting for an operator"],
  ["idemgate_review_entered_total", "operations handed to an operator"],
  ["idemgate_ambiguous_submissions_total", "creates sent without a definite answer"],
  ["idemgate_reconciled_without_resend_total", "unknown operations resolved by looking"],
  ["idemgate_protected_resends_total", "resends under the same provider idempotency key"],
  ["idemgate_suspected_duplicates_total", "operations several provider tasks claimed"],
  ["idemgate_fenced_writes_dropped_total", "stale workers' writes dropped by fencing"],
  ["idemgate_webhook_duplicates_total", "webhook deliveries seen before"],
  ["idemgate_webhook_refused_total", "webhook deliveries whose signature failed"],
  ["idemgate_stale_connections_refused_total", "kept-alive connections with bytes waiting, not sent on"],
  ["idemgate_database_up", "the database answered the scrape"],
];

// The charts of the Safety view: the gauges of live states, and the safety counters, sampled
// from /metrics every SAMPLE_MS while the view is open (at most an hour of samples is kept).
const LIVE_STATES = ["prepared", "sending", "accepted", "unknown", "review"];
const COUNTERS = [
  ["idemgate_ambiguous_submissions_total", "ambiguous sends"],
  ["idemgate_reconciled_without_resend_total", "reconciled, no resend"],
  ["idemgate_protected_resends_total", "protected resends"],
  ["idemgate_suspected_duplicates_total", "suspected duplicates"],
  ["idemgate_fenced_writes_dropped_total", "fenced writes"],
  ["idemgate_review_entered_total", "entered review"],
];
const COLORS = ["#3c6df0", "#e07b00", "#0b8a55", "#b3261e", "#7b3fc4", "#5a6477"];
const SAMPLE_MS = 5000, MAX_SAMPLES = 720;
const samples = { t: [], states: LIVE_STATES.map(() => []), counters: COUNTERS.map(() => []) };
const charts = {};
let sampler = null;

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

class ApiError extends Error {
  constructor(status, problem) {
    super(problem && problem.detail ? `${status} ${problem.title}: ${problem.detail}`
                                    : `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

// One call of the API with the admin token; the parsed JSON (or text), or an ApiError.
async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${token()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer",
  });
  const type = r.headers.get("Content-Type") || "";
  const data = type.includes("json") ? await r.json() : await r.text();
  if (!r.ok) {
    if (r.status === 401) signOut("The gateway refused the token.");
    throw new ApiError(r.status, typeof data === "object" ? data : null);
  }
  return data;
}

function status(text, isError) {
  const s = $("status");
  s.textContent = text || "";
  s.classList.toggle("error", !!isError);
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement("td");
    if (c instanceof Node) td.appendChild(c);
    else td.textContent = c === null || c === undefined ? "—" : String(c);
    tr.appendChild(td);
  }
  return tr;
}

// "3h 02m", "4m 10s", "12s": how long ago an RFC 3339 time was.
function since(iso) {
  if (!iso) return null;
  let s = Math.max(0, Math.floor((Date.now() - Date.parse(iso)) / 1000));
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  s %= 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m ${String(s).padStart(2, "0")}s`;
  return `${s}s`;
}

function stateBadge(state) {
  return el("span", state, `state state-${state}`);
}

// A job's cost: what was settled (completed, or canceled: a task the provider ended may be
// billed), else the estimate reserved for it; null for a provider without a price table.
function jobCost(cost) {
  if (!cost) return null;
  if (cost.micros === null || cost.micros === undefined)
    return `not settled (estimate ${money(cost.estimate_micros)} ${cost.currency})`;
  return `${money(cost.micros)} ${cost.currency} (estimate ${money(cost.estimate_micros)})`;
}

// A yes/no question in a modal dialog; resolves true on Confirm.
function confirmAction(text) {
  const dlg = $("confirm");
  $("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true });
    dlg.returnValue = "cancel";
    dlg.showModal();
  });
}

// ---- views ----------------------------------------------------------------------------------

let current = "overview";

function show(view) {
  current = view;
  clearInterval(sampler);
  sampler = null;
  for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== `view-${view}`;
  for (const b of document.querySelectorAll("#nav button[data-view]"))
    b.classList.toggle("active", b.dataset.view === view);
  status("");
  const load = { overview: loadOverview, review: loadReview, jobs: () => searchJobs(null),
                 providers: loadProviders, spend: loadSpend, safety: loadSafety }[view];
  if (load) load().catch((e) => status(e.message, true));
  if (view === "safety")
    sampler = setInterval(() => loadSafety().catch((e) => status(e.message, true)), SAMPLE_MS);
}

function jobLink(j) {
  const a = el("a", j.id, "mono");
  a.href = "#";
  a.addEventListener("click", (ev) => { ev.preventDefault(); openJob(j.id); });
  return a;
}

async function loadReview() {
  const [list, unknown] = await Promise.all([
    api("GET", "/v1/admin/jobs?state=review&limit=1000"),
    api("GET", "/v1/admin/jobs?state=unknown&limit=100")]);
  const body = $("review-table").querySelector("tbody");
  body.replaceChildren();
  for (const j of list.data) {
    const tr = row([jobLink(j), `${j.provider} / ${j.route}`, since(j.first_sent_at),
                    `${j.attempts.transport} sent`, j.last_error]);
    tr.className = "clickable";
    tr.dataset.job = j.id;
    tr.addEventListener("click", (ev) => { if (ev.target.tagName !== "A") openJob(j.id); });
    body.appendChild(tr);
  }
  $("review-empty").hidden = list.data.length > 0;
  // Jobs in unknown wait for reconciliation, not for an operator; but they are in doubt too.
  const n = unknown.data.length, more = unknown.has_more ? "+" : "";
  const oldest = unknown.data.length ? unknown.data[unknown.data.length - 1] : null;
  $("review-unknown").hidden = n === 0;
  $("review-unknown").textContent = n === 0 ? "" :
    `${n}${more} job(s) are unknown: sent without a definite answer, reconciliation is still ` +
    `looking for them (the oldest sent ${since(oldest.first_sent_at || oldest.created_at)} ago). ` +
    "One that reconciliation cannot settle comes here.";
}

// ---- overview -------------------------------------------------------------------------------

const STATES = ["prepared", "sending", "accepted", "unknown", "review", "completed", "failed",
                "canceled"];
const HOUR_S = 3600;
let overview = null;

// "1h 02m", "4m 10s", "12.3 s": a duration in seconds.
function duration(s) {
  if (s === null || s === undefined) return null;
  if (s < 60) return `${s.toFixed(1)} s`;
  const t = Math.round(s);
  const d = Math.floor(t / 86400), h = Math.floor((t % 86400) / 3600);
  const m = Math.floor((t % 3600) / 60);
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  return `${m}m ${String(t % 60).padStart(2, "0")}s`;
}

// A job's time to its result, or so far while it is live.
function jobDuration(j) {
  const from = Date.parse(j.created_at);
  if (j.finished_at) return duration((Date.parse(j.finished_at) - from) / 1000);
  return `${duration(Math.max(0, (Date.now() - from) / 1000))} so far`;
}

function lineChart(id, opts, data) {
  if (charts[id]) charts[id].destroy();
  const box = $(id);
  charts[id] = new uPlot({ width: Math.max(320, box.clientWidth - 8), height: 220, ...opts },
                         data, box);
  return charts[id];
}

function drawDoubt(state, d) {
  const card = $(`doubt-${state}`);
  const field = (f) => card.querySelector(`[data-field="${f}"]`);
  field("count").textContent = d.count;
  field("age").textContent = d.oldest_age_seconds === null ? "—"
                                                             : duration(d.oldest_age_seconds);
  field("job").replaceChildren(d.oldest_job ? jobLink({ id: d.oldest_job }) : "");
  card.classList.toggle("attention", d.count > 0);
  card.dataset.count = d.count;
}

function drawHours(jobs) {
  const last = Math.floor(Date.now() / 1000 / HOUR_S) * HOUR_S;
  const xs = [];
  for (let t = last - 23 * HOUR_S; t <= last; t += HOUR_S) xs.push(t);
  const shown = STATES.filter((s) => jobs.by_state[s] > 0);
  const ys = shown.map(() => xs.map(() => 0));
  for (const h of jobs.by_hour) {
    const i = xs.indexOf(Date.parse(h.hour) / 1000), k = shown.indexOf(h.state);
    if (i >= 0 && k >= 0) ys[k][i] += h.count;
  }
  lineChart("chart-hours", {
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
    series: [{}, ...shown.map((label) => ({ label, stroke: COLORS[STATES.indexOf(label) %
                                                                   COLORS.length], width: 2 }))],
    axes: [{}, { size: 50 }],
  }, [xs, ...ys]);
  $("chart-hours").dataset.states = shown.join(" ");
  const total = STATES.reduce((a, s) => a + jobs.by_state[s], 0);
  $("states-total").textContent = `(${total} in all)`;
  const body = $("states-table").querySelector("tbody");
  body.replaceChildren();
  for (const s of STATES) {
    const tr = row([stateBadge(s), jobs.by_state[s]]);
    tr.dataset.state = s;
    tr.cells[1].className = "num";
    body.appendChild(tr);
  }
}

// The tenant and currency choices of the 30-day spend, kept across reloads when still offered.
function fillSelect(sel, values, keepFirst) {
  const was = sel.value;
  const first = keepFirst ? [sel.options[0]] : [];
  sel.replaceChildren(...first, ...values.map((v) => { const o = el("option", v); o.value = v;
                                                       return o; }));
  if ([...sel.options].some((o) => o.value === was)) sel.value = was;
}

function drawSpend30() {
  const spend = overview.spend_30d;
  const tenant = $("spend30-tenant").value, currency = $("spend30-currency").value;
  const rows = spend.data.filter((r) => (!tenant || r.tenant === tenant) &&
                                        r.currency === currency);
  const today = dayStart(new Date().toISOString().slice(0, 10));
  const xs = [];
  for (let t = today - 29 * DAY_S; t <= today; t += DAY_S) xs.push(t);
  const label = (r) => `${r.provider} / ${r.model ?? "(no model)"}`;
  const names = [...new Set(rows.map(label))].sort();
  const micros = names.map(() => xs.map(() => 0));
  const totals = new Map();
  for (const r of rows) {
    const i = xs.indexOf(dayStart(r.day)), k = names.indexOf(label(r));
    if (i >= 0) micros[k][i] += r.cost_micros;
    const t = totals.get(label(r)) || { r, jobs: 0, micros: 0 };
    t.jobs += r.jobs;
    t.micros += r.cost_micros;
    totals.set(label(r), t);
  }
  const budget = tenant ? spend.budgets.find((b) => b.tenant === tenant &&
                                                   b.currency === currency) : null;
  const series = names.map((n, k) => ({ label: n, stroke: COLORS[k % COLORS.length], width: 2,
    value: (u, v) => (v === null || v === undefined ? "—" : money(Math.round(v * 1e6))) }));
  const data = [xs, ...micros.map((m) => m.map((v) => v / 1e6))];
  if (budget && budget.day_limit_micros !== null) {
    series.push({ label: "daily budget", stroke: "#b3261e", width: 2, dash: [6, 4],
                  points: { show: false } });
    data.push(xs.map(() => budget.day_limit_micros / 1e6));
  }
  lineChart("chart-spend30", {
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
    scales: { x: { time: true, range: () => [xs[0] - DAY_S / 2, xs[xs.length - 1] + DAY_S / 2] },
              y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } },
    series: [{ label: "UTC day", value: (u, ts) => (ts === null ? "—" : isoDay(ts)) },
             ...series],
    axes: [{}, { size: 70 }],
  }, data);
  const box = $("chart-spend30");
  box.dataset.series = names.join("|");
  box.dataset.budget = budget && budget.day_limit !== null ? budget.day_limit : "";
  const sum = [...totals.values()].reduce((a, t) => a + t.micros, 0);
  $("spend30-totals").textContent = names.length ? `(${money(sum)} ${currency} in 30 days` +
    (budget ? `; ${tenant} this month: ${usedOf(budget.month_used, budget.month_limit)}, ` +
              `today: ${usedOf(budget.day_used, budget.day_limit)}` : "") + ")" : "";
  const body = $("spend30-table").querySelector("tbody");
  body.replaceChildren();
  for (const [name, t] of [...totals.entries()].sort()) {
    const tr = row([t.r.provider, t.r.model, currency, t.jobs, money(t.micros)]);
    tr.dataset.series = name;
    tr.cells[3].className = tr.cells[4].className = "num";
    body.appendChild(tr);
  }
  $("spend30-empty").hidden = totals.size > 0;
}

function drawLatency(times) {
  const body = $("latency-table").querySelector("tbody");
  body.replaceChildren();
  for (const t of times) {
    const tr = row([t.provider, t.jobs, duration(t.p50_seconds), duration(t.p95_seconds)]);
    tr.dataset.provider = t.provider;
    for (const c of [1, 2, 3]) tr.cells[c].className = "num";
    body.appendChild(tr);
  }
  if (!times.length) {
    const tr = row(["No job completed in the last 24 hours."]);
    tr.cells[0].colSpan = 4;
    body.appendChild(tr);
  }
}

async function loadOverview() {
  overview = await api("GET", "/v1/admin/overview");
  drawDoubt("unknown", overview.in_doubt.unknown);
  drawDoubt("review", overview.in_doubt.review);
  drawHours(overview.jobs_24h);
  const spend = overview.spend_30d;
  fillSelect($("spend30-tenant"), [...new Set([...spend.data.map((r) => r.tenant),
                                              ...spend.budgets.map((b) => b.tenant)])].sort(),
             true);
  fillSelect($("spend30-currency"), [...new Set(spend.data.map((r) => r.currency))].sort(),
             false);
  drawSpend30();
  drawLatency(overview.time_to_complete_24h);
}

// ---- jobs -----------------------------------------------------------------------------------

let jobsNext = null, jobsPage = 1;

// A page of every tenant's jobs, newest first: the first (after null) or the one after a cursor.
async function searchJobs(after) {
  const q = new URLSearchParams({ limit: $("jobs-limit").value });
  const val = (id) => $(id).value.trim();
  if (val("search-key")) q.set("idempotency_key", val("search-key"));
  if (val("search-tenant")) q.set("tenant", val("search-tenant"));
  if ($("search-state").value) q.set("state", $("search-state").value);
  if (val("search-provider")) q.set("provider", val("search-provider"));
  if (after) q.set("starting_after", after);
  const list = await api("GET", `/v1/admin/jobs?${q}`);
  jobsPage = after ? jobsPage + 1 : 1;
  jobsNext = list.has_more ? list.next_cursor : null;
  const body = $("jobs-table").querySelector("tbody");
  body.replaceChildren();
  for (const j of list.data) {
    const tr = row([jobLink(j), stateBadge(j.state), j.tenant, el("span", j.idempotency_key,
                                                                   "mono"),
                    `${j.provider} / ${j.route}`, jobCost(j.cost), jobDuration(j),
                    j.created_at]);
    tr.dataset.job = j.id;
    body.appendChild(tr);
  }
  $("jobs-empty").hidden = list.data.length > 0;
  $("jobs-next").disabled = !jobsNext;
  $("jobs-page-size").textContent = $("jobs-limit").value;
  $("jobs-page").textContent = `Page ${jobsPage}${list.has_more ? "" : " (the last)"}.`;
  status(`${list.data.length} job(s)`);
}

let openId = null;

async function openJob(id) {
  const d = await api("GET", `/v1/admin/jobs/${encodeURIComponent(id)}`);
  const j = d.job;
  openId = j.id;
  for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== "view-job";
  $("job-id").textContent = j.id;
  $("job-state").replaceChildren(stateBadge(j.state));
  const facts = [
    ["tenant", j.tenant],
    ["provider / route", `${j.provider} / ${j.route}`],
    ["idempotency key", j.idempotency_key],
    ["remote id", j.remote_id],
    ["cost", jobCost(j.cost)],
    ["cancel requested", j.cancel_requested_at],
    ["created", j.created_at],
    ["first sent", j.first_sent_at ? `${j.first_sent_at} (${since(j.first_sent_at)} ago)` : null],
    ["attempts", `${j.attempts.transport} sent, generation ${j.attempts.generation}`],
    ["provider status", j.provider_status],
    ["last error", j.last_error],
    ["resolution", j.resolution ? `${j.resolution.outcome} by ${j.resolution.by} at ${j.resolution.at}`
                                : null],
    ["blocked", j.blocked ? j.blocked.reason : null],
    ["finished", j.finished_at],
  ];
  const dl = $("job-facts");
  dl.replaceChildren();
  for (const [k, v] of facts) {
    dl.appendChild(el("dt", k));
    dl.appendChild(el("dd", v === null || v === undefined ? "—" : v));
  }
  const body = $("attempts-table").querySelector("tbody");
  body.replaceChildren();
  d.attempts.forEach((a, i) =>
    body.appendChild(row([i + 1, a.kind, a.outcome, a.http_status, a.bytes_sent, a.decision,
                          a.started_at, a.finished_at, a.error])));
  if (!d.attempts.length) body.appendChild(row(["", "no attempt recorded"]));
  // A provider may echo the prompt (OpenAI's revised_prompt): never shown — nor a body that is
  // not JSON (a stream's events, text), whose members cannot be told apart: its size only.
  const shown = (k, v) => {
    if (/prompt/i.test(k)) return "(not shown)";
    if (k === "body_base64" && typeof v === "string")
      return `(not shown: a body that is not JSON, ${v.length / 4 * 3 - (v.match(/=*$/)[0].length)} bytes)`;
    return v;
  };
  $("job-result").textContent = j.result ? JSON.stringify(j.result, shown, 2) : "(no answer stored)";
  $("resolve").hidden = j.state !== "review";
  await showOutputs(j);
}

// Output previews: the archived bytes, read with the admin token, shown from a blob: URL (the
// CSP allows blob: for images and media only); any other type is a download link of the same
// bytes. The provider's expiring URLs are never fetched from the page.
let previewUrls = [];

async function showOutputs(j) {
  for (const u of previewUrls) URL.revokeObjectURL(u);
  previewUrls = [];
  const box = $("outputs");
  box.replaceChildren();
  const outs = (j.archive || []).filter((o) => o.state === "archived");
  $("outputs-none").hidden = outs.length > 0;
  $("outputs-none").textContent = j.archive && j.archive.length
    ? `No output archived yet (${j.archive.map((o) => o.state).join(", ")}).`
    : "No archived output.";
  for (const o of outs) {
    const fig = el("figure");
    fig.dataset.index = o.index;
    box.appendChild(fig);
    const r = await fetch(`/v1/admin/jobs/${encodeURIComponent(j.id)}/outputs/${o.index}`, {
      headers: { Authorization: `Bearer ${token()}` }, credentials: "omit", cache: "no-store",
      referrerPolicy: "no-referrer" });
    if (!r.ok) {
      fig.appendChild(el("figcaption", `output ${o.index}: HTTP ${r.status}`, "error"));
      continue;
    }
    const blob = await r.blob();
    const url = URL.createObjectURL(blob);
    previewUrls.push(url);
    fig.dataset.bytes = blob.size;
    const type = (o.content_type || "").split(";")[0].trim().toLowerCase();
    let media = null;
    if (type.startsWith("image/") && type !== "image/svg+xml") media = el("img");
    else if (type.startsWith("video/")) { media = el("video"); media.controls = true; }
    else if (type.startsWith("audio/")) { media = el("audio"); media.controls = true; }
    const caption = el("figcaption",
                       `output ${o.index}: ${o.content_type || "unknown type"}, ${blob.size} bytes`);
    if (media) {
      media.src = url;
      media.alt = `output ${o.index}`;
      media.addEventListener("error", () => {
        fig.dataset.rendered = "no";
        caption.textContent += " (the browser cannot render these bytes)";
      });
      if (media.tagName === "IMG")
        media.addEventListener("load", () => { fig.dataset.rendered = "yes"; });
      fig.appendChild(media);
    }
    /* The download as plain bytes: a blob keeps the provider's type but not the server's
       attachment and sandbox headers, and opened in a tab an HTML or SVG output would be a
       document of the console's origin. */
    const raw = URL.createObjectURL(new Blob([blob], { type: "application/octet-stream" }));
    previewUrls.push(raw);
    const a = el("a", "Download");
    a.href = raw;
    a.download = `${j.id}-${o.index}`;
    fig.appendChild(caption);
    fig.appendChild(a);
  }
}

async function resolveJob(outcome) {
  const id = openId;
  const body = { outcome };
  const operator = $("operator").value.trim();
  if (operator) body.operator = operator;
  let question;
  if (outcome === "found") {
    const remote = $("remote-id").value.trim();
    if (!remote) { status("A found task needs its remote id.", true); return; }
    body.remote_id = remote;
    question = `Adopt provider task ${remote} as the result of ${id}? Nothing is sent again.`;
  } else if (outcome === "absent") {
    question = `Declare that ${id} never reached the provider? Its create is sent again: if ` +
               "the task does exist, this pays twice.";
  } else {
    question = `Abandon ${id}? It ends failed and is never sent again.`;
  }
  if (!(await confirmAction(question))) { status("Nothing was done."); return; }
  const j = await api("POST", `/v1/jobs/${encodeURIComponent(id)}/resolve`, body);
  await openJob(id);
  status(`Resolved ${id} (${outcome}): now ${j.state}.`);
}

async function loadProviders() {
  const list = await api("GET", "/v1/admin/providers");
  const body = $("providers-table").querySelector("tbody");
  body.replaceChildren();
  for (const p of list.data) {
    let action = "";
    if (p.tripped) {
      action = el("button", "Reset");
      action.type = "button";
      action.addEventListener("click", () => resetProvider(p.name).catch((e) =>
        status(e.message, true)));
    }
    const tr = row([p.name, p.mode, el("span", p.tripped ? "tripped" : "ok",
                                        p.tripped ? "tripped" : "ok"),
                    p.http_status, p.reason, p.tripped_at, action]);
    tr.dataset.provider = p.name;
    body.appendChild(tr);
  }
}

async function resetProvider(name) {
  if (!(await confirmAction(`Reset ${name}'s credential breaker? Its waiting jobs are sent ` +
                            "again: do it once the key is fixed.")))
    return;
  const r = await api("POST", `/v1/admin/providers/${encodeURIComponent(name)}/reset`);
  await loadProviders();
  status(r.cleared ? `${name}: breaker reset.` : `${name} was not tripped.`);
}

// The value of each sample of /metrics' text, by name with its labels as written
// (`idemgate_operations{state="review"}`).
function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split("\n")) {
    const m = /^([a-z_]+(?:\{[^}]*\})?) (\S+)$/.exec(line);
    if (m) out.set(m[1], m[2]);
  }
  return out;
}

function chart(id, names) {
  if (charts[id]) return charts[id];
  const el = $(id);
  const opts = {
    width: Math.max(320, el.clientWidth - 8), height: 220,
    // Counts: from zero, whole-number ticks.
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
    series: [{}, ...names.map((label, i) => ({ label, stroke: COLORS[i % COLORS.length],
                                              width: 2 }))],
    axes: [{}, { size: 50, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4,
                                    2e4, 5e4, 1e5, 1e6] }],
  };
  charts[id] = new uPlot(opts, [[], ...names.map(() => [])], el);
  return charts[id];
}

function record(values) {
  const num = (k) => (values.has(k) ? Number(values.get(k)) : null);
  samples.t.push(Date.now() / 1000);
  LIVE_STATES.forEach((s, i) => samples.states[i].push(num(`idemgate_operations{state="${s}"}`)));
  COUNTERS.forEach(([k], i) => samples.counters[i].push(num(k)));
  if (samples.t.length > MAX_SAMPLES) {
    samples.t.shift();
    for (const a of [...samples.states, ...samples.counters]) a.shift();
  }
  chart("chart-states", LIVE_STATES).setData([samples.t, ...samples.states]);
  chart("chart-safety", COUNTERS.map(([, label]) => label))
    .setData([samples.t, ...samples.counters]);
  for (const id of ["chart-states", "chart-safety"]) $(id).dataset.samples = samples.t.length;
}

async function loadSafety() {
  const values = parseMetrics(await api("GET", "/metrics"));
  record(values);
  const body = $("safety-table").querySelector("tbody");
  body.replaceChildren();
  for (const [name, meaning] of SAFETY) {
    const tr = row([el("span", name, "mono"), values.has(name) ? values.get(name) : null,
                    meaning]);
    tr.dataset.metric = name;
    body.appendChild(tr);
  }
}

// ---- spend ----------------------------------------------------------------------------------

const DAY_S = 86400;
let spendSeq = 0;

// Integer micro-units as the API writes amounts: 370371 → "0.370371".
function money(micros) {
  const m = Math.abs(micros);
  return `${micros < 0 ? "-" : ""}${Math.floor(m / 1e6)}.${String(m % 1e6).padStart(6, "0")}`;
}

// Unix seconds of a UTC day's midnight ("2026-12-01"), the day of a time in Unix seconds, and the
// day n days after one.
function dayStart(day) {
  return Date.parse(`${day}T00:00:00Z`) / 1000;
}

function isoDay(ts) {
  return new Date(ts * 1000).toISOString().slice(0, 10);
}

function addDays(day, n) {
  return isoDay(dayStart(day) + n * DAY_S);
}

// The form's default: this UTC month so far.
function spendDefaults() {
  const today = new Date().toISOString().slice(0, 10);
  $("spend-from").value = `${today.slice(0, 8)}01`;
  $("spend-to").value = today;
}

// "used / limit", a missing or null limit being none.
function usedOf(used, limit) {
  return `${used ?? "—"} / ${limit ?? "no limit"}`;
}

// The cost of each UTC day from `from` to `to` (both included), summed over tenants, one bar
// series per currency, in currency units. A currency's bars sit side by side within the day.
function spendChart(from, to, rows) {
  const xs = [];
  for (let t = dayStart(from); t <= dayStart(to); t += DAY_S) xs.push(t);
  const currencies = [...new Set(rows.map((r) => r.currency))].sort();
  const micros = currencies.map(() => xs.map(() => 0));
  for (const r of rows) {
    const i = (dayStart(r.day) - xs[0]) / DAY_S;
    if (i >= 0 && i < xs.length && r.cost_micros !== null && r.cost_micros !== undefined)
      micros[currencies.indexOf(r.currency)][i] += r.cost_micros;
  }
  $("spend-totals").textContent = currencies.length
    ? `(in these days: ${currencies.map((c, k) =>
        `${money(micros[k].reduce((a, b) => a + b, 0))} ${c}`).join(", ")})`
    : "";

  if (charts.spend) charts.spend.destroy();
  const box = $("chart-spend");
  // Each day's bars fill 70% of it, one beside the other in the currencies' order.
  const group = 0.7 * DAY_S, width = group / Math.max(1, currencies.length);
  const bars = currencies.map((label, k) => ({
    label, stroke: COLORS[k % COLORS.length], fill: `${COLORS[k % COLORS.length]}99`, width: 1,
    points: { show: false },
    value: (u, v) => (v === null || v === undefined ? "—" : money(Math.round(v * 1e6))),
    paths: uPlot.paths.bars({ disp: {
      x0: { unit: 1, values: (u) => u.data[0].map((t) => t - group / 2 + k * width) },
      size: { unit: 1, values: () => [width] },
    } }),
  }));
  const opts = {
    width: Math.max(320, box.clientWidth - 8), height: 220,
    // The form's days, in UTC whatever the browser's zone, with half a day each side (uPlot's
    // own range for a single day would span years), ticks a whole number of days apart.
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
    scales: {
      x: { time: true, range: () => [xs[0] - DAY_S / 2, xs[xs.length - 1] + DAY_S / 2] },
      y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] },
    },
    series: [{ label: "UTC day", value: (u, ts) => (ts === null ? "—" : isoDay(ts)) }, ...bars],
    axes: [{ incrs: [1, 2, 3, 4, 5, 7, 10, 15, 30, 60, 90, 180, 365, 730, 1825]
                      .map((d) => d * DAY_S) },
           { size: 70 }],
  };
  charts.spend = new uPlot(opts, [xs, ...micros.map((m) => m.map((v) => v / 1e6))], box);
  box.dataset.currencies = currencies.join(" ");
  box.dataset.days = xs.length;
}

async function loadSpend() {
  if (!$("spend-from").value || !$("spend-to").value) spendDefaults();
  const from = $("spend-from").value, to = $("spend-to").value, group = $("spend-group").value;
  if (from > to) throw new Error(`From (${from}) is after to (${to}).`);
  // The API's `to` is excluded: the day after the form's last day.
  const url = (g) => `/v1/usage?${new URLSearchParams({ from, to: addDays(to, 1), group_by: g })}`;
  const seq = ++spendSeq;
  const [doc, days] = await Promise.all([api("GET", url(group)),
                                         group === "day" ? null : api("GET", url("day"))]);
  if (seq !== spendSeq) return; // a newer request was made meanwhile: it draws
  spendChart(from, to, (days || doc).data);

  $("spend-group-head").textContent = doc.group_by;
  const body = $("spend-table").querySelector("tbody");
  body.replaceChildren();
  for (const r of doc.data) {
    const tr = row([r.tenant, r[doc.group_by], r.currency, r.jobs, r.cost]);
    tr.dataset.tenant = r.tenant;
    tr.dataset.group = r[doc.group_by];
    tr.cells[3].className = tr.cells[4].className = "num";
    body.appendChild(tr);
  }
  $("spend-empty").hidden = doc.data.length > 0;

  // Every tenant has a row; those without a budget (currency null) are counted, not listed.
  const budgets = $("budgets-table").querySelector("tbody");
  budgets.replaceChildren();
  const budgeted = doc.budgets.filter((b) => b.currency !== null);
  for (const b of budgeted) {
    const tr = row([b.tenant, b.currency, usedOf(b.day_used, b.day_limit),
                    usedOf(b.month_used, b.month_limit), usedOf(b.in_flight, b.max_in_flight)]);
    tr.dataset.tenant = b.tenant;
    budgets.appendChild(tr);
  }
  if (!budgeted.length) {
    const tr = row(["No tenant has a budget."]);
    tr.cells[0].colSpan = 5;
    budgets.appendChild(tr);
  }
  const others = doc.budgets.length - budgeted.length;
  $("budgets-unbudgeted").textContent = others ? `${others} tenant(s) without a budget are not ` +
                                                 "listed." : "";
  status(`${doc.data.length} row(s) from ${from} to ${to}`);
}

// ---- sign-in --------------------------------------------------------------------------------

function signedIn() {
  $("signin").hidden = true;
  $("nav").hidden = false;
  show(current);
}

function signOut(why) {
  sessionStorage.removeItem(TOKEN_KEY);
  for (const v of document.querySelectorAll(".view")) v.hidden = true;
  $("nav").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = why || "";
  status("");
}

function guard(fn) {
  return (ev) => {
    if (ev) ev.preventDefault();
    Promise.resolve().then(fn).catch((e) => status(e.message, true));
  };
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", guard(async () => {
    sessionStorage.setItem(TOKEN_KEY, $("token").value);
    $("token").value = "";
    try {
      await api("GET", "/v1/admin/providers");   // proves the token before anything is shown
    } catch (e) {
      if (e.status !== 401) signOut(e.message);
      return;
    }
    $("signin-error").textContent = "";
    signedIn();
  }));
  $("sign-out").addEventListener("click", () => signOut());
  for (const b of document.querySelectorAll("#nav button[data-view]"))
    b.addEventListener("click", () => show(b.dataset.view));
  $("review-refresh").addEventListener("click", guard(loadReview));
  $("providers-refresh").addEventListener("click", guard(loadProviders));
  $("safety-refresh").addEventListener("click", guard(loadSafety));
  $("spend-form").addEventListener("submit", guard(loadSpend));
  $("job-refresh").addEventListener("click", guard(() => openJob(openId)));
  $("job-id-form").addEventListener("submit", guard(() => openJob($("search-id").value.trim())));
  $("job-search-form").addEventListener("submit", guard(() => searchJobs(null)));
  $("jobs-first").addEventListener("click", guard(() => searchJobs(null)));
  $("jobs-next").addEventListener("click", guard(() => searchJobs(jobsNext)));
  $("overview-refresh").addEventListener("click", guard(loadOverview));
  $("spend30-tenant").addEventListener("change", guard(drawSpend30));
  $("spend30-currency").addEventListener("change", guard(drawSpend30));
  $("resolve-found").addEventListener("click", guard(() => resolveJob("found")));
  $("resolve-absent").addEventListener("click", guard(() => resolveJob("absent")));
  $("resolve-abandon").addEventListener("click", guard(() => resolveJob("abandon")));
  spendDefaults();
  if (token()) signedIn();
});
