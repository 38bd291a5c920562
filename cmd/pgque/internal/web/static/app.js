// pgque console. Every value from the server is rendered with textContent
// (never innerHTML): keys, reasons and payloads are hostile input.
"use strict";

const page = { "/": "queues", "/consumers": "consumers", "/keys": "keys", "/dlq": "dlq" }[location.pathname] || "queues";
const params = new URLSearchParams(location.search);
const SVG = "http://www.w3.org/2000/svg";
let actionsEnabled = false;

// el(tag, attrs, ...children) builds an element; strings become text nodes.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fmtNum(n) { return n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US", { maximumFractionDigits: 1 }); }
function fmtAge(sec) {
  if (sec === null || sec === undefined) return "-";
  if (sec < 1) return Math.round(sec * 1000) + "ms";
  if (sec < 60) return sec.toFixed(1) + "s";
  if (sec < 3600) return Math.floor(sec / 60) + "m" + Math.round(sec % 60) + "s";
  return Math.floor(sec / 3600) + "h" + Math.round((sec % 3600) / 60) + "m";
}
function fmtKey(k) { return k === null || k === undefined ? "(null)" : JSON.stringify(k); }
function fmtTime(t) { return t ? new Date(t).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "-"; }

// table(id, headers, rows): rows are arrays of cells; a cell is a value or
// {v, cls} or a Node.
function table(id, headers, rows, empty) {
  const body = rows.length ? rows.map((r) => el("tr", {}, r.map((c) => {
    if (c instanceof Node) return el("td", {}, c);
    if (c !== null && typeof c === "object") return el("td", { class: c.cls || "" }, c.v);
    return el("td", { class: typeof c === "number" ? "num" : "" }, typeof c === "number" ? fmtNum(c) : c);
  }))) : [el("tr", {}, el("td", { class: "empty", colspan: String(headers.length) }, empty || "nothing"))];
  return el("table", { id }, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))), el("tbody", {}, body));
}

// chart draws the series [[t, v], ...] as an inline SVG sparkline.
function chart(title, series, fmt) {
  const w = 260, h = 70, pad = 4;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("role", "img"); svg.setAttribute("aria-label", title);
  const axis = document.createElementNS(SVG, "line");
  axis.setAttribute("class", "axis"); axis.setAttribute("x1", 0); axis.setAttribute("x2", w);
  axis.setAttribute("y1", h - pad); axis.setAttribute("y2", h - pad);
  svg.append(axis);
  const last = series.length ? series[series.length - 1][1] : null;
  if (series.length > 1) {
    const t0 = series[0][0], t1 = series[series.length - 1][0];
    const vmax = Math.max(...series.map((p) => p[1]), 1e-9);
    const xy = series.map(([t, v]) => [((t - t0) / Math.max(t1 - t0, 1)) * w, h - pad - (v / vmax) * (h - 2 * pad - 10)]);
    const d = xy.map(([x, y], i) => (i ? "L" : "M") + x.toFixed(1) + " " + y.toFixed(1)).join(" ");
    const area = document.createElementNS(SVG, "path");
    area.setAttribute("class", "area"); area.setAttribute("d", d + ` L${w} ${h - pad} L0 ${h - pad} Z`);
    const line = document.createElementNS(SVG, "path");
    line.setAttribute("class", "line"); line.setAttribute("d", d);
    const top = document.createElementNS(SVG, "text");
    top.setAttribute("x", 2); top.setAttribute("y", 10); top.textContent = "max " + fmt(vmax);
    const span = document.createElementNS(SVG, "text");
    span.setAttribute("x", w - 2); span.setAttribute("y", 10); span.setAttribute("text-anchor", "end");
    span.textContent = "last " + fmtAge((t1 - t0) / 1000);
    svg.append(area, line, top, span);
  }
  return el("div", { class: "chart" }, el("div", { class: "title" }, title, ": ", last === null ? "-" : fmt(last)), svg);
}

function seriesOf(history, field, name) {
  return history.filter((p) => p[field] && name in p[field]).map((p) => [p.t, p[field][name]]);
}

// The token comes in the address, /#token=<token> (or ?token=): it is kept
// in this tab's session storage, which belongs to the console's origin
// (port included), and taken out of the address. It goes to the API in a
// header, never a cookie: a browser sends a cookie to every port of the
// host, and so to whatever else listens there.
// A token pasted into the address of an open page changes only its hash:
// hashchange takes it then.
function takeToken() {
  const hash = new URLSearchParams(location.hash.slice(1));
  const query = new URLSearchParams(location.search);
  const t = hash.get("token") || query.get("token");
  if (!t) return false;
  sessionStorage.setItem("pgque-token", t);
  hash.delete("token");
  query.delete("token");
  const rest = query.toString();
  history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + (hash.toString() ? "#" + hash.toString() : ""));
  return true;
}
takeToken();
window.addEventListener("hashchange", () => { if (takeToken()) refresh(); });

async function getJSON(url) {
  const headers = token() ? { "X-Pgque-Token": token() } : {};
  const r = await fetch(url, { cache: "no-store", credentials: "omit", headers });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

function token() { return sessionStorage.getItem("pgque-token") || ""; }

// act posts an action with the token in a header (never a cookie).
async function act(action, body, what) {
  if (!confirm(what + "?")) return;
  try {
    const r = await fetch("/api/actions/" + action, {
      method: "POST", cache: "no-store", credentials: "omit",
      headers: { "Content-Type": "application/json", "X-Pgque-Token": token() },
      body: JSON.stringify(body),
    });
    const res = await r.json();
    if (!r.ok) throw new Error(res.error || r.statusText);
    showError("");
    notice(what + ": done (" + JSON.stringify(res.result) + ")" + (res.warning ? ". Warning: " + res.warning : ""));
    refresh();
  } catch (e) {
    showError(what + " failed: " + e.message);
  }
}

function showError(msg) { const e = document.getElementById("error"); e.textContent = msg; e.hidden = !msg; }
function notice(msg) { const e = document.getElementById("notice"); e.textContent = msg; e.hidden = !msg; }

function setMode(enabled) {
  actionsEnabled = enabled;
  const m = document.getElementById("mode");
  m.textContent = enabled ? "actions enabled" : "read-only";
  m.className = "mode" + (enabled ? " actions" : "");
  document.getElementById("token-box").hidden = !enabled;
}

function picker(label, name, options, current, onchange) {
  const sel = el("select", { id: "pick-" + name, onchange: (ev) => onchange(ev.target.value) },
    options.map((o) => { const opt = el("option", { value: o.value }, o.label); if (o.value === current) opt.selected = true; return opt; }));
  return el("div", { class: "pick" }, el("label", {}, label + " ", sel));
}

function go(path, q) { location.href = path + "?" + new URLSearchParams(q).toString(); }

// ---- pages

function renderQueues(ov) {
  const rows = ov.queues.map((q) => [q.queue, q.ev_per_sec === null ? "-" : q.ev_per_sec, q.backlog, q.blocked_keys, q.unticked,
    q.unticked === 0 ? "idle" : fmtAge(q.ticker_lag_seconds), `table ${q.current_table + 1} of ${q.tables}`,
    fmtAge(q.since_rotation_seconds) + " / " + fmtAge(q.rotation_period_seconds), q.retry_pending, q.dead_letters]);
  const charts = ov.queues.map((q) => el("div", { class: "charts" },
    chart(q.queue + " rate (ev/s)", seriesOf(ov.history, "rate", q.queue), fmtNum),
    chart(q.queue + " backlog", seriesOf(ov.history, "backlog", q.queue), fmtNum),
    chart(q.queue + " ticker lag", seriesOf(ov.history, "ticker_lag", q.queue), fmtAge)));
  return [el("h2", {}, "Queues"),
    table("queues", ["queue", "rate ev/s", "backlog", "blocked keys", "unticked", "ticker lag", "rotation", "since switch / period", "retry pending", "dead letters"], rows, "no queues"),
    ...renderBlockers(ov),
    el("h2", {}, "Last minutes"), charts];
}

// What holds back table rotation or the tick/state flips: sessions (pid,
// role, since when, the lock) and subscriptions. Only an admin's console
// can read them; for other roles the section is left out.
function renderBlockers(ov) {
  if (ov.rotation_blockers === null || ov.rotation_blockers === undefined) return [];
  const now = Date.now();
  const rows = ov.rotation_blockers.map((b) => [b.queue === null ? "(tick/state flips)" : b.queue, b.kind,
    b.pid === null ? "-" : b.pid, b.role === null ? "-" : b.role,
    b.since === null ? "-" : fmtAge((now - Date.parse(b.since)) / 1000) + " ago",
    b.holds === null ? "-" : b.holds, b.what]);
  return [el("h2", {}, "Rotation blockers"),
    table("blockers", ["queue", "kind", "pid", "role", "since", "holds", "what"], rows, "nothing holds back rotation")];
}

function renderConsumers(ov) {
  const groups = ov.groups.map((g) => [el("a", { href: "/keys?" + new URLSearchParams({ queue: g.queue, consumer: g.consumer }) }, g.queue + " / " + g.consumer),
    g.nslots, g.owned, g.workers, g.lag, fmtAge(g.head_age_seconds), g.blocked_keys, g.policy]);
  const slots = ov.slots.map((s) => [s.queue, s.consumer, s.slot + "/" + s.nslots, s.owner === null ? { v: "unowned", cls: "state state-blocked" } : s.owner,
    s.epoch, s.lag, fmtAge(s.oldest_pending_seconds), s.blocked_keys, s.held_keys > 0 ? s.held_keys + " keys, " + s.held_events + " ev, " + fmtAge(s.oldest_hold_seconds) : "-",
    s.open_batch === null ? "-" : String(s.open_batch), fmtAge(s.last_active_seconds) + " ago"]);
  const plain = ov.consumers.map((c) => [c.queue, c.consumer, c.pending, fmtAge(c.lag_seconds), fmtAge(c.last_seen_seconds) + " ago", c.retry_pending]);
  const charts = ov.groups.map((g) => el("div", { class: "charts" },
    chart(g.queue + "/" + g.consumer + " lag (events)", seriesOf(ov.history, "lag", g.queue + "/" + g.consumer), fmtNum),
    chart(g.queue + "/" + g.consumer + " head age", seriesOf(ov.history, "head_age", g.queue + "/" + g.consumer), fmtAge)));
  return [el("h2", {}, "Partitioned consumers"),
    table("groups", ["consumer", "slots", "owned", "workers", "lag", "oldest head", "blocked keys", "policy"], groups, "no partitioned consumers"),
    charts,
    el("h2", {}, "Slots"),
    table("slots", ["queue", "consumer", "slot", "owner", "epoch", "lag", "head age", "blocked keys", "held keys (lanes)", "open batch", "last active"], slots, "no slots"),
    el("h2", {}, "Plain consumers"),
    table("consumers", ["queue", "consumer", "pending", "cursor age", "last seen", "retry pending"], plain, "no plain consumers")];
}

function stateCell(st) { return { v: st, cls: "state state-" + st.replace(" ", "-") }; }

function renderKeys(ov, kr) {
  const opts = ov.groups.map((g) => ({ value: g.queue + "\u0000" + g.consumer, label: g.queue + " / " + g.consumer }));
  const cur = (params.get("queue") || "") + "\u0000" + (params.get("consumer") || "");
  const out = [picker("consumer", "consumer", opts, cur, (v) => { const [queue, consumer] = v.split("\u0000"); go("/keys", { queue, consumer }); })];
  if (!kr) { out.push(el("p", { class: "muted" }, opts.length ? "pick a partitioned consumer" : "no partitioned consumers")); return out; }
  if (kr.warnings.length) out.push(el("ul", { class: "warnings", id: "key-warnings" }, kr.warnings.map((w) => el("li", {}, w))));
  const keyActions = (key) => actionsEnabled ? [
    el("button", { onclick: () => act("retry-now", { queue: kr.queue, consumer: kr.consumer, key }, "retry the head of key " + fmtKey(key) + " now") }, "retry now"),
    el("button", { class: "danger", onclick: () => act("unblock", { queue: kr.queue, consumer: kr.consumer, key }, "dead-letter the head of key " + fmtKey(key) + " and release the rest") }, "unblock"),
  ] : [];
  out.push(el("h2", {}, "Oldest pending heads"),
    table("heads", ["slot", "key", "state", "head ev_id", "head age", "pending", "failures", "reason", "retry", "deferred"],
      kr.heads.map((h) => [h.slot, { v: fmtKey(h.key), cls: "wrap" }, stateCell(h.state), String(h.head_ev_id), fmtAge(h.head_age_seconds),
        (h.estimated ? "~" : "") + fmtNum(h.pending), h.failures || "-", { v: h.reason || "-", cls: "wrap" },
        h.retry_at ? fmtTime(h.retry_at) : "-", h.deferred || 0]), "no pending events"),
    el("h2", {}, "Blocked keys"),
    table("blocked", ["slot", "key", "state", "head ev_id", "since", "failures", "deferred", "reason", ""],
      kr.blocked.map((b) => [b.slot, { v: fmtKey(b.key), cls: "wrap" }, stateCell(b.state), String(b.head_ev_id),
        fmtTime(b.since), b.failures, b.deferred, { v: b.reason || "-", cls: "wrap" }, el("span", {}, b.state === "blocked" ? keyActions(b.key) : [])]), "no blocked keys"),
    el("h2", {}, "Hottest keys"),
    table("hot", ["key", "events", "ev/s", "share", "window"],
      kr.hot.map((h) => [{ v: fmtKey(h.key), cls: "wrap" }, (h.estimated ? "~" : "") + fmtNum(h.events), h.rate_per_second,
        Math.round(100 * h.share) + "%", fmtAge(h.span_seconds)]), "no events in the window"),
    el("h2", {}, "Pending work per slot"),
    table("shares", ["slot", "pending", "top key", "top key pending", "share", "keys"],
      kr.shares.map((s) => [s.slot, (s.estimated ? "~" : "") + fmtNum(s.pending), { v: s.pending === 0 ? "-" : fmtKey(s.top_key), cls: "wrap" }, s.pending === 0 ? "-" : s.top_pending,
        { v: Math.round(100 * s.share) + "%", cls: s.hot ? "state state-blocked" : "" }, s.keys]), "no slots"));
  return out;
}

// dlqQueue is the queue the dead-letter page shows: the one picked, or
// the only queue there is.
function dlqQueue(ov) { return params.get("queue") || (ov.queues.length === 1 ? ov.queues[0].queue : ""); }

// payloadText shows a dead letter's payload: JSON indented, a payload that
// is not JSON as stored.
function payloadText(d) {
  if (d.payload_text !== undefined && d.payload_text !== null) return d.payload_text;
  return d.payload === null ? "(null)" : JSON.stringify(d.payload, null, 2);
}

function renderDLQ(ov, dl) {
  const opts = ov.queues.map((q) => ({ value: q.queue, label: q.queue + " (" + q.dead_letters + ")" }));
  const queue = dlqQueue(ov);
  const consumer = params.get("consumer") || "";
  const out = [picker("queue", "queue", opts, queue, (v) => go("/dlq", { queue: v }))];
  if (!dl) { out.push(el("p", { class: "muted" }, opts.length ? "pick a queue" : "no queues")); return out; }
  // One entry per consumer as subscribed: a partitioned consumer's dead
  // letters of every slot are under its name.
  const names = [...new Set([...ov.consumers.filter((c) => c.queue === queue).map((c) => c.consumer),
    ...ov.groups.filter((g) => g.queue === queue).map((g) => g.consumer), ...dl.dead_letters.map((d) => d.consumer)])].sort();
  out.push(picker("consumer", "dlq-consumer", [{ value: "", label: "every consumer" }, ...names.map((n) => ({ value: n, label: n }))],
    consumer, (v) => go("/dlq", v ? { queue, consumer: v } : { queue })));
  const inspect = el("div", { id: "inspect" });
  const show = (d) => {
    inspect.replaceChildren(el("h2", {}, "Dead letter " + d.dl_id + " (event " + d.ev_id + ", key " + fmtKey(d.partition_key) + ")"),
      el("p", {}, "reason: ", d.reason || "-"), el("pre", { class: "payload", id: "payload" }, payloadText(d)));
  };
  const rows = dl.dead_letters.map((d) => [String(d.dl_id), d.consumer, d.slot === null ? "-" : String(d.slot), String(d.ev_id), d.type || "-",
    { v: fmtKey(d.partition_key), cls: "wrap" }, d.retry_count, fmtTime(d.dead_since), { v: d.reason || "-", cls: "wrap" },
    el("span", {}, el("button", { onclick: () => show(d) }, "inspect"),
      actionsEnabled ? el("button", { onclick: () => act("replay", { queue, id: d.dl_id }, "replay dead letter " + d.dl_id) }, "replay") : null)]);
  const of = consumer ? queue + " / " + consumer : queue;
  out.push(el("h2", {}, "Dead letters of " + of),
    table("dead-letters", ["dl_id", "consumer", "slot", "ev_id", "type", "key", "retries", "dead since", "reason", ""], rows, "no dead letters"));
  if (actionsEnabled && dl.dead_letters.length) {
    const what = consumer ? { queue, consumer } : { queue };
    out.push(el("p", {}, el("button", { class: "danger", id: "purge", onclick: () => act("purge", what, "purge every dead letter of " + of) }, "purge all")));
  }
  out.push(inspect);
  return out;
}

// ---- refresh loop

let inspectKeep = null;
async function refresh() {
  try {
    const ov = await getJSON("/api/overview");
    setMode(ov.actions_enabled);
    let content;
    if (page === "queues") content = renderQueues(ov);
    else if (page === "consumers") content = renderConsumers(ov);
    else if (page === "keys") {
      const q = params.get("queue"), c = params.get("consumer");
      const kr = q && c ? await getJSON("/api/keys?" + new URLSearchParams({ queue: q, consumer: c })) : null;
      content = renderKeys(ov, kr);
    } else {
      const q = dlqQueue(ov), c = params.get("consumer");
      const dl = q ? await getJSON("/api/dlq?" + new URLSearchParams(c ? { queue: q, consumer: c } : { queue: q })) : null;
      content = renderDLQ(ov, dl);
    }
    const main = document.getElementById("main");
    // Keep an open payload across refreshes.
    inspectKeep = document.getElementById("inspect");
    main.replaceChildren(...content.flat());
    const fresh = document.getElementById("inspect");
    if (inspectKeep && fresh && inspectKeep.childNodes.length) fresh.replaceWith(inspectKeep);
    document.getElementById("updated").textContent = "updated " + new Date(ov.time).toLocaleTimeString();
    showError("");
    document.body.dataset.loaded = page;
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  } catch (e) {
    showError("refresh failed: " + e.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const a of document.querySelectorAll("nav a")) if (a.dataset.page === page) a.classList.add("active");
  const t = document.getElementById("token");
  t.value = token();
  t.addEventListener("input", () => sessionStorage.setItem("pgque-token", t.value));
  refresh();
  setInterval(refresh, page === "dlq" || page === "keys" ? 5000 : 2000);
});
