// postbox dashboard: plain JavaScript, no build step. Every URL is relative to the page,
// so the dashboard works under a reverse proxy's path prefix. Data goes into the DOM as
// text (never as HTML).
"use strict";

const STATES = ["waiting", "pending", "queued", "running", "retrying", "succeeded", "dead", "cancelled", "expired"];
const TERMINAL = new Set(["succeeded", "dead", "cancelled", "expired"]);
const PAGE_SIZE = 50;
const main = document.getElementById("main");
let session = { mode: "read-only", logged_in: false, csrf: null, can_act: false, can_read_args: false };
let current = null; // the page on screen: {name, refresh(), onEvent(evt)}
let settled = 0; // pages whose first load ended, shown in body[data-settled] for tests

// ---- helpers -------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function svg(tag, attrs) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) el.setAttribute(name, String(value));
  return el;
}

// Times are shown in the viewer's zone (the browser's), each labelled with its zone's
// abbreviation; the header says which zone that is. A schedule's times are also shown
// in the schedule's own zone.
const VIEWER_ZONE = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
const ZONE_FORMATS = new Map();

function zoneFormat(zone) {
  if (!ZONE_FORMATS.has(zone)) {
    let format;
    try {
      format = new Intl.DateTimeFormat("en-GB", {
        timeZone: zone, year: "numeric", month: "2-digit", day: "2-digit",
        hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short",
      });
    } catch (error) {
      format = null; // a zone this browser does not know
    }
    ZONE_FORMATS.set(zone, format);
  }
  return ZONE_FORMATS.get(zone);
}

function when(value, zone) {
  if (!value) return "";
  const date = new Date(value);
  const format = zoneFormat(zone || VIEWER_ZONE) || zoneFormat("UTC");
  const p = Object.fromEntries(format.formatToParts(date).map((part) => [part.type, part.value]));
  return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second} ${p.timeZoneName}`;
}

function zoneName(zone) {
  const parts = (zoneFormat(zone) || zoneFormat("UTC")).formatToParts(new Date());
  const short = (parts.find((part) => part.type === "timeZoneName") || {}).value;
  return short && short !== zone ? `${zone} (${short})` : zone;
}

function ago(value) {
  if (!value) return "";
  const seconds = Math.max(0, (Date.now() - new Date(value).getTime()) / 1000);
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}

function secs(value) {
  if (value === null || value === undefined) return "–";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  return `${value.toFixed(value < 10 ? 2 : 0)} s`;
}

function num(value) {
  return value === null || value === undefined ? "–" : Number(value).toLocaleString("en-US");
}

function badge(text, kind) {
  return h("span", { class: `badge ${kind || text}` }, text);
}

function json(value) {
  return JSON.stringify(value, null, 2);
}

class ApiFailure extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code;
    this.details = error.details || {};
  }
}

async function api(path, options = {}) {
  const method = options.method || "GET";
  const headers = { Accept: "application/json" };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && session.csrf) headers["X-CSRF-Token"] = session.csrf;
  const response = await fetch(path, {
    method,
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    credentials: "same-origin",
  });
  const text = await response.text();
  const body = text ? JSON.parse(text) : null;
  if (!response.ok) throw new ApiFailure(response.status, body);
  return body;
}

function banner(message) {
  const el = document.getElementById("banner");
  el.textContent = message || "";
  el.hidden = !message;
}

function confirmDialog(message) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = message;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

async function act(label, run) {
  try {
    const result = await run();
    banner("");
    return result;
  } catch (error) {
    banner(`${label}: ${error.message}`);
    return null;
  }
}

function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") search.set(name, value);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

function table(columns, rows, rowAttrs) {
  return h(
    "table",
    {},
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.num ? "num" : null }, c.title)))),
    h(
      "tbody",
      {},
      rows.length
        ? rows.map((row) =>
            h("tr", rowAttrs ? rowAttrs(row) : {}, columns.map((c) => h("td", { class: c.num ? "num" : null }, c.cell(row)))),
          )
        : h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, "nothing here")),
    ),
  );
}

// ---- live updates: the events WebSocket, reconnecting --------------------------------

const live = { socket: null, delay: 500, timer: null, pending: false, asked: 0 };

function connectLive() {
  const url = new URL("ws/events", window.location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  url.hash = "";
  const socket = new WebSocket(url);
  live.socket = socket;
  const indicator = document.getElementById("live");
  socket.onopen = () => {
    live.delay = 500;
    indicator.textContent = "live";
    indicator.className = "live on";
    scheduleRefresh(); // events may have been missed while away
  };
  socket.onmessage = (message) => {
    let evt;
    try {
      evt = JSON.parse(message.data);
    } catch {
      return;
    }
    if (current && current.onEvent) current.onEvent(evt);
    else scheduleRefresh();
  };
  socket.onclose = () => {
    indicator.textContent = "reconnecting…";
    indicator.className = "live off";
    setTimeout(connectLive, live.delay);
    live.delay = Math.min(live.delay * 2, 5000);
  };
}

function scheduleRefresh() {
  live.asked = Date.now();
  if (live.timer) {
    live.pending = true;
    return;
  }
  // A busy system sends many events: a page re-reads at most every `every` ms (the overview, heavier, less often).
  const every = (current && current.every) || 400;
  live.timer = setTimeout(async () => {
    live.timer = null;
    if (current && !document.getElementById("confirm").open) await current.refresh();
    if (live.pending) {
      live.pending = false;
      scheduleRefresh();
    }
  }, every);
}

// ---- session ---------------------------------------------------------------------------

async function loadSession() {
  try {
    session = await api("ui/session");
  } catch (error) {
    banner(`API unreachable: ${error.message}`);
  }
  const who = document.getElementById("who");
  who.replaceChildren();
  if (session.logged_in) {
    who.append(h("button", { id: "logout", onclick: logout }, "Log out"));
  } else if (session.mode === "key") {
    who.append(h("a", { href: "#/login", id: "login-link" }, "Log in"));
  } else if (session.mode === "insecure") {
    who.append(h("span", { class: "badge retrying" }, "insecure mode"));
  } else {
    who.append(h("span", { class: "muted" }, "read-only (no API key configured)"));
  }
}

async function logout() {
  await act("log out", () => api("ui/logout", { method: "POST" }));
  await loadSession();
  route();
}

function loginPage() {
  const input = h("input", { type: "password", name: "key", id: "key", autocomplete: "current-password", required: true });
  const message = h("p", { class: "muted", id: "login-message" });
  const form = h(
    "form",
    {
      class: "login",
      onsubmit: async (event) => {
        event.preventDefault();
        try {
          await api("ui/login", { method: "POST", body: { key: input.value } });
        } catch (error) {
          message.textContent = error.message;
          return;
        }
        await loadSession();
        window.location.hash = "#/";
      },
    },
    h("label", { for: "key" }, "API key"),
    input,
    h("button", { class: "primary", type: "submit" }, "Log in"),
  );
  main.replaceChildren(
    h("h1", {}, "Log in"),
    h("p", {}, "Actions (cancel, retry, pause, purge…) need the API key. It starts a session kept in an HttpOnly cookie for this site only; the key itself is not stored."),
    form,
    message,
  );
  return { name: "login", refresh: async () => {} };
}

// ---- overview --------------------------------------------------------------------------

function chart(minutes) {
  const width = 600;
  const height = 140;
  const bottom = 16;
  const start = Date.now() - 59 * 60000;
  const slots = Array.from({ length: 60 }, () => ({ ok: 0, bad: 0 }));
  for (const m of minutes) {
    const index = Math.floor((new Date(m.minute).getTime() - start) / 60000) + 1;
    const slot = slots[Math.min(59, Math.max(0, index))];
    slot.ok += m.succeeded + m.other;
    slot.bad += m.dead;
  }
  const peak = Math.max(1, ...slots.map((s) => s.ok + s.bad));
  const el = svg("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", id: "throughput" });
  const barWidth = width / 60;
  slots.forEach((slot, i) => {
    const okHeight = ((height - bottom) * slot.ok) / peak;
    const badHeight = ((height - bottom) * slot.bad) / peak;
    const x = i * barWidth + 1;
    el.append(svg("rect", { class: "ok", x, width: barWidth - 2, y: height - bottom - okHeight, height: okHeight }));
    el.append(svg("rect", { class: "bad", x, width: barWidth - 2, y: height - bottom - okHeight - badHeight, height: badHeight }));
  });
  const label = (x, text, anchor) => {
    const t = svg("text", { x, y: height - 4, "text-anchor": anchor });
    t.textContent = text;
    el.append(t);
  };
  label(2, "−60 min", "start");
  label(width - 2, "now", "end");
  const top = svg("text", { x: 2, y: 10 });
  top.textContent = `peak ${peak}/min`;
  el.append(top);
  return el;
}

function card(label, value, id) {
  return h("div", { class: "card", id }, h("div", { class: "value" }, value), h("div", { class: "label" }, label));
}

function overviewPage() {
  const body = h("div", {});
  main.replaceChildren(h("h1", {}, "Overview"), body);
  let unfinished = false;
  async function refresh() {
    const data = await act("overview", () => api("api/v1/dashboard/overview"));
    if (!data) return;
    unfinished = data.queues.some((q) => q.backlog || q.queued || q.in_flight || q.retrying);
    const leader = data.relays.find((r) => r.role === "leader");
    const done = data.last_hour.reduce((sum, m) => sum + m.succeeded + m.other, 0);
    const dead = data.last_hour.reduce((sum, m) => sum + m.dead, 0);
    const lag = data.relay_lag_seconds === null ? "0 s" : secs(data.relay_lag_seconds);
    body.replaceChildren(
      h(
        "div",
        { class: "cards" },
        card("finished, last hour", num(done), "card-finished"),
        card("dead, last hour", num(dead), "card-dead"),
        card(`start latency p50 (${num(data.latency.jobs)} jobs)`, secs(data.latency.p50_seconds), "card-p50"),
        card("start latency p95", secs(data.latency.p95_seconds), "card-p95"),
        card("relay leader", leader ? (leader.host === null ? leader.id : `${leader.host}:${leader.pid}`) : "none", "card-leader"),
        card(`relay lag (${data.unpublished_more ? "> 10,000" : num(data.unpublished_due)} due)`, lag, "card-lag"),
        card("workers alive", `${data.workers.live}${data.workers.stale ? ` (+${data.workers.stale} stale)` : ""}`, "card-workers"),
      ),
      h("h2", {}, "Jobs finished per minute (green) and dead (red), last hour"),
      chart(data.last_hour),
      h("h2", {}, "Queues"),
      table(
        [
          { title: "queue", cell: (q) => h("a", { href: `#/jobs${query({ queue: q.queue })}` }, q.queue) },
          { title: "", cell: (q) => (q.paused ? badge("paused") : "") },
          { title: "backlog", num: true, cell: (q) => num(q.backlog) },
          { title: "scheduled", num: true, cell: (q) => num(q.scheduled) },
          { title: "queued", num: true, cell: (q) => num(q.queued) },
          { title: "running", num: true, cell: (q) => num(q.in_flight) },
          { title: "retrying", num: true, cell: (q) => num(q.retrying) },
          { title: "dead", num: true, cell: (q) => h("a", { href: `#/dlq${query({ queue: q.queue })}` }, num(q.dead)) },
          { title: "oldest waiting", num: true, cell: (q) => secs(q.oldest_waiting_seconds) },
        ],
        data.queues,
        (q) => ({ dataset: { queue: q.queue } }),
      ),
    );
  }
  return { name: "overview", refresh, onEvent: scheduleRefresh, every: 1500, poll: () => unfinished };
}

// ---- job lists (jobs and dead letters) ------------------------------------------------

function jobListPage(kind, params) {
  const dead = kind === "dlq";
  const filter = {
    queue: params.get("queue") || "",
    task: params.get("task") || "",
    state: dead ? "dead" : params.get("state") || "",
    discarded: dead ? params.get("discarded") || "" : "",
    since: params.get("since") || "",
    until: params.get("until") || "",
    text: params.get("text") || "",
  };
  const selected = new Set();
  let allMatching = null; // {count, more} once "all matching" is chosen
  let cursors = [null];
  let rows = [];
  const tableBox = h("div", { id: "job-table" });
  const toolbar = h("div", { class: "toolbar", id: "bulk-bar" });
  const pager = h("div", { class: "toolbar" });

  const field = (name, label, input) => h("label", {}, label, input);
  const inputs = {
    queue: h("input", { name: "queue", value: filter.queue, placeholder: "any", size: 10 }),
    task: h("input", { name: "task", value: filter.task, placeholder: "any", size: 14 }),
    state: h("select", { name: "state" }, h("option", { value: "" }, "any"), STATES.map((s) => h("option", { value: s, selected: s === filter.state }, s))),
    discarded: h(
      "select",
      { name: "discarded" },
      h("option", { value: "" }, "both"),
      h("option", { value: "false", selected: filter.discarded === "false" }, "not discarded"),
      h("option", { value: "true", selected: filter.discarded === "true" }, "discarded"),
    ),
    since: h("input", { name: "since", type: "datetime-local", value: filter.since }),
    until: h("input", { name: "until", type: "datetime-local", value: filter.until }),
    text: h("input", { name: "text", value: filter.text, placeholder: session.can_read_args ? "substring" : "needs the API key", disabled: !session.can_read_args, size: 16 }),
  };
  const form = h(
    "form",
    {
      class: "filters",
      id: "filters",
      onsubmit: (event) => {
        event.preventDefault();
        const next = {};
        for (const [name, input] of Object.entries(inputs)) if (input.value && !(dead && name === "state")) next[name] = input.value;
        window.location.hash = `#/${kind}${query(next)}`;
      },
    },
    field("queue", "queue", inputs.queue),
    field("task", "task", inputs.task),
    dead ? field("discarded", "discarded", inputs.discarded) : field("state", "state", inputs.state),
    field("since", "created since", inputs.since),
    field("until", "created before", inputs.until),
    field("text", "args contain", inputs.text),
    h("button", { type: "submit", class: "primary" }, "Filter"),
    h("a", { href: `#/${kind}` }, "clear"),
  );

  function apiFilter() {
    const out = {};
    for (const [name, value] of Object.entries(filter)) {
      if (!value) continue;
      if (name === "since" || name === "until") out[name] = new Date(value).toISOString();
      else if (name === "discarded") out[name] = value === "true";
      else out[name] = value;
    }
    return out;
  }

  const actions = dead
    ? [
        { action: "requeue", label: "Requeue", verb: "requeue" },
        { action: "discard", label: "Discard", verb: "discard" },
      ]
    : [
        { action: "cancel", label: "Cancel", verb: "cancel" },
        { action: "requeue", label: "Retry", verb: "retry (requeue the dead ones of)" },
      ];

  async function runBulk(spec) {
    const count = allMatching ? allMatching.count : selected.size;
    const what = allMatching ? `all ${num(count)}${allMatching.more ? " (the newest; more match)" : ""} jobs matching the filter${searchedNote(allMatching)}` : `${num(count)} selected job${count === 1 ? "" : "s"}`;
    if (!(await confirmDialog(`${spec.label}: ${spec.verb} ${what}?`))) return;
    const body = allMatching ? { filter: apiFilter() } : { ids: [...selected] };
    const result = await act(spec.label, () => api(`api/v1/bulk/${spec.action}`, { method: "POST", body }));
    if (result) {
      const skipped = Object.entries(result.skipped).map(([code, n]) => `${n} ${code.toLowerCase()}`).join(", ");
      toolbar.dataset.result = `${result.done}`;
      showNotice(`${spec.label}: ${result.done} of ${result.matched} done${skipped ? `; skipped: ${skipped}` : ""}.`);
      selected.clear();
      allMatching = null;
      await refresh();
    }
  }

  const notice = h("p", { class: "notice", id: "bulk-result", hidden: true });
  function showNotice(text) {
    notice.textContent = text;
    notice.hidden = false;
  }

  function renderToolbar() {
    const count = allMatching ? allMatching.count : selected.size;
    const label = allMatching
      ? `All ${num(allMatching.count)}${allMatching.more ? "+" : ""} matching the filter${searchedNote(allMatching)} selected`
      : `${selected.size} selected`;
    toolbar.replaceChildren(
      h("span", { id: "selection" }, label),
      allMatching
        ? h("button", { onclick: () => { allMatching = null; renderToolbar(); renderTable(); } }, "Clear selection")
        : h("button", { id: "select-all-matching", onclick: selectAllMatching }, "Select all matching the filter"),
      ...actions.map((spec) =>
        h("button", { class: "danger", id: `bulk-${spec.action}`, disabled: !count || !session.can_act, title: session.can_act ? null : "log in first", onclick: () => runBulk(spec) }, `${spec.label}…`),
      ),
    );
  }

  // A count with a text match reads the newest jobs only (down to searched_down_to): say so.
  function searchedNote(found) {
    return found.searched_down_to ? ` among jobs from #${found.searched_down_to} up (older ones not searched)` : "";
  }

  async function selectAllMatching() {
    const found = await act("count", () => api(`api/v1/dashboard/jobs/count${query(apiFilter())}`));
    if (!found) return;
    allMatching = found;
    renderToolbar();
    renderTable();
  }

  function renderTable() {
    const pageBox = h("input", {
      type: "checkbox",
      id: "select-page",
      title: "select this page",
      checked: allMatching !== null || (rows.length > 0 && rows.every((r) => selected.has(r.id))),
      disabled: allMatching !== null,
      onchange: (event) => {
        for (const r of rows) event.target.checked ? selected.add(r.id) : selected.delete(r.id);
        renderToolbar();
        renderTable();
      },
    });
    const columns = [
      {
        title: pageBox,
        cell: (r) =>
          h("input", {
            type: "checkbox",
            class: "row-select",
            checked: allMatching !== null || selected.has(r.id),
            disabled: allMatching !== null,
            onchange: (event) => {
              event.target.checked ? selected.add(r.id) : selected.delete(r.id);
              renderToolbar();
            },
          }),
      },
      { title: "id", num: true, cell: (r) => h("a", { href: `#/jobs/${r.id}` }, r.id) },
      { title: "task", cell: (r) => r.task },
      { title: "queue", cell: (r) => r.queue },
      { title: "state", cell: (r) => h("span", { class: "state" }, badge(r.state), r.discarded_at ? " discarded" : "") },
      { title: "attempts", num: true, cell: (r) => `${r.attempts}/${r.max_attempts}` },
      { title: "created", cell: (r) => when(r.created_at) },
      { title: dead ? "died" : "finished", cell: (r) => when(r.finished_at) },
      { title: "last error", cell: (r) => (r.last_error ? `${r.last_error_class || ""}: ${r.last_error}`.slice(0, 120) : "") },
    ];
    tableBox.replaceChildren(table(columns, rows, (r) => ({ dataset: { id: r.id, state: r.state } })));
  }

  function renderPager(next, searched) {
    const page = cursors.length;
    pager.replaceChildren(
      searched > 1
        ? h("span", { class: "muted", id: "search-window" }, `Args text search reads up to 50,000 jobs per page: searched down to job ${searched}.`)
        : "",
      h("button", { id: "page-newest", disabled: page === 1, onclick: () => { cursors = [null]; refresh(); } }, "« Newest"),
      h("button", { id: "page-prev", disabled: page === 1, onclick: () => { cursors.pop(); refresh(); } }, "‹ Newer"),
      h("span", { class: "muted", id: "page-number" }, `page ${page}`),
      h("button", { id: "page-next", disabled: !next, onclick: () => { cursors.push(next); refresh(); } }, searched && next ? "Search older ›" : "Older ›"),
    );
  }

  async function refresh() {
    const cursor = cursors[cursors.length - 1];
    const data = await act("jobs", () => api(`api/v1/dashboard/jobs${query({ ...apiFilter(), limit: PAGE_SIZE, cursor })}`));
    if (!data) return;
    rows = data.items;
    renderTable();
    renderToolbar();
    renderPager(data.next_cursor, data.searched_down_to);
  }

  const purge = dead ? purgeForm() : null;
  main.replaceChildren(h("h1", {}, dead ? "Dead letters" : "Jobs"), form, toolbar, notice, tableBox, pager, purge || "");
  renderToolbar();
  return {
    name: kind,
    refresh,
    onEvent: (evt) => {
      if (!filter.queue || evt.queue === filter.queue) scheduleRefresh();
    },
    poll: () => rows.some((r) => !TERMINAL.has(r.state)),
  };
}

function purgeForm() {
  const queue = h("input", { name: "purge-queue", id: "purge-queue", required: true, size: 10 });
  const older = h("input", { name: "older-than", id: "purge-older", type: "number", min: 0, value: 0, size: 8 });
  const onlyDiscarded = h("input", { type: "checkbox", id: "purge-discarded" });
  return h(
    "div",
    {},
    h("h2", {}, "Purge"),
    h(
      "form",
      {
        class: "filters",
        id: "purge",
        onsubmit: async (event) => {
          event.preventDefault();
          const params = { queue: queue.value, older_than: older.value || 0, discarded_only: onlyDiscarded.checked };
          let count = null;
          try {
            await api(`api/v1/dlq/purge${query(params)}`, { method: "POST" });
          } catch (error) {
            if (error.code !== "CONFIRMATION_REQUIRED") {
              banner(`purge: ${error.message}`);
              return;
            }
            count = error.details.would_purge;
          }
          if (count === null) return;
          if (!(await confirmDialog(`Purge: delete ${num(count)} dead letters of queue ${params.queue} for good?`))) return;
          const done = await act("purge", () => api(`api/v1/dlq/purge${query({ ...params, confirm: true })}`, { method: "POST" }));
          if (done) {
            banner("");
            const note = document.getElementById("bulk-result");
            note.textContent = `Purged ${done.purged} dead letters of ${done.queue}.`;
            note.hidden = false;
            current.refresh();
          }
        },
      },
      h("label", {}, "queue", queue),
      h("label", {}, "dead for at least (s)", older),
      h("label", {}, "only discarded", onlyDiscarded),
      h("button", { type: "submit", class: "danger", disabled: !session.can_act }, "Purge…"),
    ),
  );
}

// ---- one job ----------------------------------------------------------------------------

function timeline(job) {
  const points = [
    ["created (committed)", job.created_at],
    ["due", job.available_at],
    ["published", job.published_at],
    ["cancel requested", job.cancel_requested_at],
    ["discarded", job.discarded_at],
  ];
  for (const a of job.history) {
    points.push([`attempt ${a.attempt}${a.life > 1 ? ` (life ${a.life})` : ""} started on ${a.worker_id || "?"}`, a.started_at]);
    if (a.finished_at) points.push([`attempt ${a.attempt} ${a.outcome || "ended"}`, a.finished_at]);
  }
  if (job.finished_at) points.push([`finished: ${job.state}`, job.finished_at]);
  return points
    .filter(([, at]) => at)
    .sort((a, b) => new Date(a[1]) - new Date(b[1]))
    .map(([label, at]) => h("li", {}, h("span", { class: "muted" }, when(at)), " ", label));
}

// The last ctx.progress() a run reported: a bar (indeterminate without a total) and its numbers.
function progressBar(p) {
  if (!p) return "";
  const known = typeof p.total === "number" && p.total > 0;
  const bar = known ? h("progress", { id: "job-progress", max: p.total, value: Math.min(p.done, p.total) }) : h("progress", { id: "job-progress" });
  const label = known ? `${p.done}/${p.total} (${Math.round((100 * Math.min(p.done, p.total)) / p.total)}%)` : `${p.done} (total unknown)`;
  return [bar, " ", h("span", { id: "job-progress-text" }, label, p.note ? ` — ${p.note}` : "", h("span", { class: "muted" }, ` attempt ${p.attempt}, ${when(p.at)}`))];
}

function jobPage(id) {
  // The page draws into its own element: an answer arriving after the reader moved on lands in a detached one.
  const body = h("div", {}, h("h1", {}, `Job ${id}`));
  main.replaceChildren(body);
  // The tracebacks the reader opened stay open when the page is drawn again (a live event, the socket reconnecting).
  const opened = new Set();
  function traceback(a) {
    const key = `${a.attempt}/${a.life || 1}`;
    const toggled = (event) => (event.target.open ? opened.add(key) : opened.delete(key));
    return h("details", { class: "traceback", open: opened.has(key), ontoggle: toggled }, h("summary", {}, "traceback"), h("pre", { class: "traceback" }, a.traceback));
  }
  let unfinished = false;
  async function refresh() {
    let job;
    try {
      job = await api(`api/v1/dashboard/jobs/${encodeURIComponent(id)}`);
      unfinished = !TERMINAL.has(job.state);
    } catch (error) {
      body.replaceChildren(h("h1", {}, `Job ${id}`), h("p", { id: "job-error" }, error.message));
      return;
    }
    const link = window.location.href;
    const buttons = [];
    if (!TERMINAL.has(job.state)) {
      buttons.push(h("button", { class: "danger", id: "job-cancel", disabled: !session.can_act, onclick: () => single("cancel", job) }, "Cancel…"));
    }
    if (["pending", "queued", "retrying"].includes(job.state)) {
      // Move a waiting job: a new priority and/or a delay from now (POST /api/v1/jobs/{id}/move, audited).
      const priority = h("input", { id: "move-priority", type: "number", min: 0, max: 9, value: job.priority, size: 2 });
      const delay = h("input", { id: "move-delay", type: "number", min: 0, step: "any", placeholder: "run in … s", size: 8 });
      buttons.push(
        h("label", {}, " priority ", priority),
        h("label", {}, " delay (s) ", delay),
        h("button", { id: "job-move", disabled: !session.can_act, onclick: () => move(job, priority.value, delay.value) }, "Move…"),
      );
    }
    if (job.state === "dead") {
      buttons.push(h("button", { class: "danger", id: "job-requeue", disabled: !session.can_act, onclick: () => single("requeue", job) }, "Requeue…"));
      if (!job.discarded_at) buttons.push(h("button", { class: "danger", id: "job-discard", disabled: !session.can_act, onclick: () => single("discard", job) }, "Discard…"));
    }
    const hidden = "(redacted: log in to see it)";
    body.replaceChildren(
      h("h1", {}, `Job ${job.id} `, h("span", { id: "job-state" }, badge(job.state))),
      h("div", { class: "toolbar" }, h("span", { class: "muted" }, "Link: "), h("a", { href: link, id: "deep-link" }, link), buttons),
      h(
        "dl",
        { class: "fields" },
        [
          ["task", job.task],
          ["queue", job.queue],
          ["priority", job.priority],
          ["attempts", `${job.attempts} of ${job.max_attempts}`],
          ["progress", progressBar(job.progress)],
          ["worker", job.worker_id || ""],
          ["dedup key", job.dedup_key || ""],
          ["last error", job.last_error ? `${job.last_error_class}: ${job.last_error}` : ""],
        ].map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]),
      ),
      h(
        "div",
        { class: "grid2" },
        h("div", {}, h("h2", {}, "Args"), h("pre", { id: "job-args" }, job.redacted ? hidden : json(job.args))),
        h("div", {}, h("h2", {}, "Headers"), h("pre", { id: "job-headers" }, job.redacted ? hidden : json(job.headers))),
      ),
      h("h2", {}, "Result"),
      h("pre", { id: "job-result" }, job.redacted ? hidden : job.keep_result ? json(job.result) : "(not kept: the task does not keep results)"),
      h("h2", {}, "Attempts"),
      table(
        [
          { title: "attempt", num: true, cell: (a) => `${a.attempt}${a.life > 1 ? ` (life ${a.life})` : ""}` },
          { title: "worker", cell: (a) => a.worker_id || "" },
          { title: "started", cell: (a) => when(a.started_at) },
          { title: "took", num: true, cell: (a) => (a.finished_at ? secs((new Date(a.finished_at) - new Date(a.started_at)) / 1000) : "running") },
          { title: "outcome", cell: (a) => (a.outcome ? badge(a.outcome) : "") },
          {
            title: "error",
            cell: (a) => [
              a.error ? h("pre", { class: "error" }, `${a.error_class || ""}: ${a.error}`) : "",
              a.traceback ? traceback(a) : "",
            ],
          },
        ],
        job.history,
      ),
      h("h2", {}, "Timeline"),
      h("ol", { class: "timeline", id: "timeline" }, timeline(job)),
    );
  }
  async function move(job, priority, delay) {
    const body = {};
    if (priority !== "" && Number(priority) !== job.priority) body.priority = Number(priority);
    if (delay !== "") body.delay_seconds = Number(delay);
    if (!Object.keys(body).length) return banner("move: change the priority or give a delay");
    const what = [body.priority !== undefined ? `priority ${job.priority} → ${body.priority}` : "", body.delay_seconds !== undefined ? `run in ${body.delay_seconds} s` : ""].filter(Boolean).join(", ");
    if (!(await confirmDialog(`Move job ${job.id} (${job.task}): ${what}?`))) return;
    if (await act("move", () => api(`api/v1/jobs/${job.id}/move`, { method: "POST", body }))) await refresh();
  }
  async function single(action, job) {
    if (!(await confirmDialog(`${action} job ${job.id} (${job.task})?`))) return;
    const path = action === "cancel" ? `api/v1/jobs/${job.id}/cancel` : `api/v1/dlq/${job.id}/${action}`;
    if (await act(action, () => api(path, { method: "POST" }))) await refresh();
  }
  return {
    name: "job",
    refresh,
    onEvent: (evt) => {
      if (String(evt.job_id) === String(id)) scheduleRefresh();
    },
    poll: () => unfinished,
  };
}

// ---- queues, workers, schedules --------------------------------------------------------

function queuesPage() {
  const body = h("div", {});
  main.replaceChildren(h("h1", {}, "Queues"), body);
  async function refresh() {
    const data = await act("queues", () => api("api/v1/dashboard/queues"));
    if (!data) return;
    body.replaceChildren(
      table(
        [
          { title: "queue", cell: (q) => h("a", { href: `#/jobs${query({ queue: q.queue })}` }, q.queue) },
          { title: "state", cell: (q) => h("span", { class: "queue-state" }, q.paused ? badge("paused") : badge("active", "succeeded")) },
          { title: "backlog", num: true, cell: (q) => num(q.backlog) },
          { title: "queued", num: true, cell: (q) => num(q.queued) },
          { title: "running", num: true, cell: (q) => num(q.in_flight) },
          { title: "in streams (approx.)", num: true, cell: (q) => num(q.in_streams) },
          { title: "dead", num: true, cell: (q) => num(q.dead) },
          {
            title: "fair",
            cell: (q) =>
              q.fair
                ? h(
                    "span",
                    {
                      class: "queue-fair",
                      title: q.fair.keys.map((k) => `${k.key || "''"}: ${k.waiting} waiting, ${k.in_flight} in flight`).join("\n"),
                    },
                    `by ${q.fair.by} · ${num(q.fair.in_flight)}/${num(q.fair.window_in_force)} in flight · ${num(q.fair.waiting)} waiting`,
                  )
                : "",
          },
          {
            title: "",
            cell: (q) =>
              h(
                "button",
                {
                  class: q.paused ? "primary" : "danger",
                  disabled: !session.can_act,
                  title: session.can_act ? null : "log in first",
                  onclick: async () => {
                    const verb = q.paused ? "resume" : "pause";
                    if (!(await confirmDialog(`${verb} queue ${q.queue}?`))) return;
                    if (await act(verb, () => api(`api/v1/queues/${encodeURIComponent(q.queue)}/${verb}`, { method: "POST" }))) await refresh();
                  },
                },
                q.paused ? "Resume…" : "Pause…",
              ),
          },
        ],
        data,
        (q) => ({ dataset: { queue: q.queue } }),
      ),
      h("p", { class: "muted" }, "Limits and slots in use will show here once flow control lands."),
    );
  }
  return { name: "queues", refresh, onEvent: scheduleRefresh };
}

function workersPage() {
  const body = h("div", {});
  main.replaceChildren(h("h1", {}, "Workers"), body);
  async function refresh() {
    const data = await act("workers", () => api("api/v1/workers"));
    if (!data) return;
    body.replaceChildren(
      table(
        [
          { title: "id", cell: (w) => w.id },
          { title: "host", cell: (w) => w.host },
          { title: "pid", num: true, cell: (w) => w.pid },
          { title: "queues", cell: (w) => w.queues.join(", ") },
          { title: "concurrency", num: true, cell: (w) => w.concurrency },
          { title: "in flight", num: true, cell: (w) => w.in_flight },
          { title: "processed", num: true, cell: (w) => num(w.processed) },
          { title: "failed", num: true, cell: (w) => num(w.failed) },
          { title: "last heartbeat", cell: (w) => `${when(w.last_seen)} (${ago(w.last_seen)})` },
          { title: "status", cell: (w) => h("span", { class: "worker-status" }, w.stopped ? badge("stopped", "") : w.stale ? badge("stale") : badge("alive", "succeeded")) },
        ],
        data,
        (w) => ({ class: w.stopped ? "stopped" : w.stale ? "stale" : null, dataset: { worker: w.id } }),
      ),
    );
  }
  return { name: "workers", refresh, onEvent: () => {}, poll: true };
}

// A schedule's time in its own zone, and in the viewer's below it when that differs.
function zoned(value, zone) {
  if (!value) return "";
  const own = when(value, zone);
  const viewer = when(value);
  return own === viewer || !zone ? own : [h("span", { class: "own-zone" }, own), h("br"), h("span", { class: "muted" }, viewer)];
}

function schedulesPage() {
  const body = h("div", {});
  main.replaceChildren(h("h1", {}, "Schedules"), body);
  async function refresh() {
    const data = await act("schedules", () => api("api/v1/schedules"));
    if (!data) return;
    const button = (s, verb, label, cls) =>
      h(
        "button",
        {
          class: cls,
          disabled: !session.can_act,
          onclick: async () => {
            if (!(await confirmDialog(`${verb} schedule ${s.name}?`))) return;
            if (await act(verb, () => api(`api/v1/schedules/${encodeURIComponent(s.name)}/${verb}`, { method: "POST" }))) await refresh();
          },
        },
        label,
      );
    body.replaceChildren(
      table(
        [
          { title: "name", cell: (s) => s.name },
          { title: "task", cell: (s) => s.task },
          { title: "queue", cell: (s) => s.queue },
          { title: "when", cell: (s) => `${s.expression} (${s.tz})` },
          { title: "next run", cell: (s) => (s.paused || s.removed ? "–" : zoned(s.next_run_at, s.tz)) },
          { title: "last run", cell: (s) => zoned(s.last_run_at, s.tz) },
          { title: "last job", cell: (s) => (s.last_job_id ? h("a", { href: `#/jobs/${s.last_job_id}` }, `${s.last_job_id} `, s.last_job_state ? badge(s.last_job_state) : "") : "") },
          { title: "state", cell: (s) => (s.removed ? badge("removed", "") : s.paused ? badge("paused") : badge("active", "succeeded")) },
          {
            title: "",
            cell: (s) =>
              s.removed ? "" : [s.paused ? button(s, "resume", "Resume…", "primary") : button(s, "pause", "Pause…", "danger"), " ", button(s, "trigger", "Run now…", "")],
          },
        ],
        data,
        (s) => ({ dataset: { schedule: s.name } }),
      ),
    );
  }
  return { name: "schedules", refresh, onEvent: scheduleRefresh };
}

// ---- workflows: a list, and one workflow's jobs as layers of its graph -------------------

function workflowsPage(params) {
  const body = h("div", {});
  const status = params.get("status") || "";
  main.replaceChildren(
    h("h1", {}, "Workflows"),
    h(
      "p",
      { class: "filters" },
      ["", "running", "succeeded", "failed", "cancelled"].map((s) =>
        h("a", { href: `#/workflows${query({ status: s })}`, class: s === status ? "active" : null }, s || "all", " "),
      ),
    ),
    body,
  );
  async function refresh() {
    const data = await act("workflows", () => api(`api/v1/workflows${query({ status, limit: PAGE_SIZE })}`));
    if (!data) return;
    const ended = (c) => ["succeeded", "dead", "cancelled", "expired"].reduce((n, s) => n + (c[s] || 0), 0);
    body.replaceChildren(
      table(
        [
          { title: "id", num: true, cell: (w) => h("a", { href: `#/workflows/${w.id}` }, w.id) },
          { title: "name", cell: (w) => w.name },
          { title: "status", cell: (w) => badge(w.status, w.status === "failed" ? "dead" : w.status) },
          { title: "progress", cell: (w) => `${num(ended(w.counts))} / ${num(w.jobs)}` },
          { title: "created", cell: (w) => when(w.created_at) },
          { title: "finished", cell: (w) => when(w.finished_at) },
        ],
        data.items,
        (w) => ({ dataset: { workflow: w.id } }),
      ),
    );
  }
  return { name: "workflows", refresh, onEvent: scheduleRefresh };
}

function workflowPage(id) {
  const body = h("div", {});
  main.replaceChildren(h("h1", {}, `Workflow ${id}`), body);
  let jobIds = new Set();
  async function refresh() {
    const data = await act("workflow", () => api(`api/v1/workflows/${encodeURIComponent(id)}`));
    if (!data) return;
    const w = data.workflow;
    jobIds = new Set(data.jobs.map((j) => j.id));
    const upstream = new Map();
    for (const e of data.edges) {
      if (!upstream.has(e.child)) upstream.set(e.child, []);
      upstream.get(e.child).push(e);
    }
    // Layers: a job's depth is one more than its deepest upstream job's.
    const depth = new Map();
    for (const j of data.jobs) {
      const ups = upstream.get(j.id) || [];
      depth.set(j.id, ups.length ? 1 + Math.max(...ups.map((e) => depth.get(e.parent) ?? 0)) : 0);
    }
    const layers = [];
    for (const j of data.jobs) (layers[depth.get(j.id)] ||= []).push(j);
    const button = (verb, label, cls) =>
      h(
        "button",
        {
          class: cls,
          disabled: !session.can_act,
          onclick: async () => {
            if (!(await confirmDialog(`${verb} workflow ${id}?`))) return;
            if (await act(verb, () => api(`api/v1/workflows/${encodeURIComponent(id)}/${verb}`, { method: "POST" }))) await refresh();
          },
        },
        label,
      );
    const ended = ["succeeded", "dead", "cancelled", "expired"].reduce((n, s) => n + (w.counts[s] || 0), 0);
    body.replaceChildren(
      h(
        "p",
        {},
        `${w.name}: `,
        badge(w.status, w.status === "failed" ? "dead" : w.status),
        ` ${num(ended)} of ${num(w.jobs)} jobs ended; on failure: ${w.on_failure}; created ${when(w.created_at)} `,
        w.status === "running" ? button("cancel", "Cancel…", "danger") : "",
        " ",
        w.status === "failed" || w.status === "cancelled" ? button("retry", "Retry…", "primary") : "",
      ),
      h("progress", { max: w.jobs, value: ended }),
      ...layers.map((jobs, i) =>
        h(
          "section",
          { class: "layer", dataset: { layer: i } },
          h("h2", {}, i === 0 ? "First" : `Step ${i}`),
          table(
            [
              { title: "id", num: true, cell: (j) => h("a", { href: `#/jobs/${j.id}` }, j.id) },
              { title: "task", cell: (j) => j.task },
              { title: "state", cell: (j) => badge(j.state) },
              { title: "waits on", cell: (j) => (upstream.get(j.id) || []).map((e) => [h("a", { href: `#/jobs/${e.parent}` }, e.parent), e.on_failure === "cancel" ? "" : ` (${e.on_failure})`, " "]) },
              { title: "attempts", num: true, cell: (j) => `${j.attempts}/${j.max_attempts}` },
              { title: "finished", cell: (j) => when(j.finished_at) },
              { title: "error", cell: (j) => j.last_error_class || "" },
            ],
            jobs,
            (j) => ({ dataset: { job: j.id, state: j.state } }),
          ),
        ),
      ),
    );
  }
  // Live: any event of one of its jobs (its releases and cascade cancels too) or of the workflow re-reads it.
  const onEvent = (evt) => {
    if (!evt || evt.job_id === undefined || jobIds.has(evt.job_id) || String(evt.workflow_id) === String(id)) {
      scheduleRefresh();
    }
  };
  return { name: "workflow", refresh, onEvent };
}

// ---- routing -------------------------------------------------------------------------------

function route() {
  const hash = window.location.hash.replace(/^#/, "") || "/";
  const [path, search] = hash.split("?");
  const params = new URLSearchParams(search || "");
  const parts = path.split("/").filter(Boolean);
  let page;
  if (session.reads_need_key && !session.logged_in && parts[0] !== "login") {
    window.location.hash = "#/login"; // POSTBOX_API_KEY_FOR_ALL: nothing to show before logging in
    return;
  }
  if (parts.length === 0) page = overviewPage();
  else if (parts[0] === "jobs" && parts.length === 2) page = jobPage(parts[1]);
  else if (parts[0] === "jobs") page = jobListPage("jobs", params);
  else if (parts[0] === "dlq") page = jobListPage("dlq", params);
  else if (parts[0] === "queues") page = queuesPage();
  else if (parts[0] === "workers") page = workersPage();
  else if (parts[0] === "schedules") page = schedulesPage();
  else if (parts[0] === "workflows" && parts.length === 2) page = workflowPage(parts[1]);
  else if (parts[0] === "workflows") page = workflowsPage(params);
  else if (parts[0] === "login") page = loginPage();
  else {
    main.replaceChildren(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/" }, "Overview")));
    page = { name: "missing", refresh: async () => {} };
  }
  current = page;
  const section = parts[0] === "jobs" && parts.length === 2 ? "jobs" : parts[0] || "overview";
  for (const link of document.querySelectorAll("header nav a")) link.classList.toggle("active", link.dataset.page === section);
  document.body.dataset.page = page.name;
  delete document.body.dataset.loaded;
  page.refresh().then(() => {
    // A page left before its first answer came must not mark (or draw over) the page that replaced it.
    if (current === page) document.body.dataset.loaded = page.name;
    document.body.dataset.settled = String(++settled);
  });
}

// Workers have no events of their own: their page re-reads every few seconds. Events are best effort (a
// worker learns of a new listener within a second; a reconnect loses what passed meanwhile), so a page that
// shows unfinished jobs also re-reads when no event of its own has asked for a re-read for as long: it never
// stays stale. (While the socket is down the API is likely down too: the page re-reads once it reconnects.)
const POLL_MS = 3000;
setInterval(() => {
  if (!current || !current.poll || document.hidden) return;
  if (current.poll === true) current.refresh();
  else if (live.socket && live.socket.readyState === WebSocket.OPEN && Date.now() - live.asked >= POLL_MS && current.poll()) scheduleRefresh();
}, POLL_MS);

window.addEventListener("hashchange", route);
document.getElementById("zone").textContent = `times in ${zoneName(VIEWER_ZONE)}`;
loadSession().then(() => {
  route();
  connectLive();
});
