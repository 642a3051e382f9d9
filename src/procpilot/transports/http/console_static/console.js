// The procpilot console: one page, four views (sessions, one session, approvals, audit).
// Everything shown comes from /console/api/* and /v1/approvals; nothing is shown before /me answers.
import { Terminal } from "./vendor/xterm/xterm.mjs";

const API = "/console/api";
// The console session's secret (see browser_auth.py): sent as a header on every request. Kept in
// sessionStorage, per tab and per origin (the port included), so a reload keeps the login, a new
// tab logs in on its own, and no page on another port can read it. Never in a cookie or a URL.
const SECRET_KEY = "procpilot-session";
const state = { me: null, secret: sessionStorage.getItem(SECRET_KEY), sessions: [], approvals: { pending: [], decided: [] }, audit: [], cpuPrev: new Map(), stream: null, started: false };
const AUDIT_KEEP = 2000;
const main = document.getElementById("main");
let leaveView = () => {}; // closes what the current view opened (streams, a terminal)

// -- small helpers --

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return node;
}

function authHeaders() {
  return state.secret ? { "X-Procpilot-Session": state.secret } : {};
}

function keepSecret(secret) {
  state.secret = secret ?? null;
  if (state.secret) sessionStorage.setItem(SECRET_KEY, state.secret);
  else sessionStorage.removeItem(SECRET_KEY);
}

async function api(path, { method = "GET", body, retried = false } = {}) {
  const headers = authHeaders();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, { method, headers, credentials: "same-origin", body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await res.json().catch(() => ({}));
  if (data.error === "CsrfRejected" && !retried) {
    // No tokens, and the daemon restarted since the page loaded (a new secret): fetch it, once.
    keepSecret((await api(`${API}/me`)).session);
    return api(path, { method, body, retried: true });
  }
  // The session ended (logged out, expired, the daemon restarted, or this browser's cookie was
  // replaced by a page on another port): ask for a login, never carry on as anyone else.
  if (res.status === 401 && path !== `${API}/login` && state.started) signedOut();
  if (!res.ok) throw Object.assign(new Error(data.message || res.statusText), { status: res.status, data });
  return data;
}

// A server-sent event stream read with fetch, which can send the session header (EventSource
// cannot). Like EventSource it reconnects after 3 s when the connection drops, and gives up on
// an answer other than 200; a 401 asks for a login. Returns { close }.
function eventStream(url, handlers) {
  const abort = new AbortController();
  let closed = false;
  const close = () => { closed = true; abort.abort(); };
  (async () => {
    while (!closed) {
      try {
        const res = await fetch(url, { headers: authHeaders(), credentials: "same-origin", signal: abort.signal });
        if (res.status === 401) { if (state.started) signedOut(); return; }
        if (!res.ok) return;
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value; // the daemon ends its lines with \n alone
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            let name = "message";
            const data = [];
            for (const line of block.split("\n")) {
              if (line.startsWith("event:")) name = line.slice(6).trim();
              else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
            }
            if (data.length && handlers[name] && !closed) handlers[name]({ data: data.join("\n") });
          }
        }
      } catch (err) {
        if (closed) return;
      }
      if (!closed) await new Promise((resolve) => setTimeout(resolve, 3000));
    }
  })();
  return { close };
}

const bytes = (n) => (n >= 1 << 30 ? (n / (1 << 30)).toFixed(1) + " GiB" : n >= 1 << 20 ? (n / (1 << 20)).toFixed(1) + " MiB" : n >= 1024 ? (n / 1024).toFixed(0) + " KiB" : n + " B");
const clock = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "");
function runtime(ms) {
  const s = Math.floor(ms / 1000);
  return s >= 3600 ? `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m` : s >= 60 ? `${Math.floor(s / 60)}m ${s % 60}s` : `${(ms / 1000).toFixed(1)}s`;
}
const ended = (s) => !["running", "restarting", "queued"].includes(s.state);
function b64bytes(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

// -- login and start --

async function boot() {
  try {
    const me = await api(`${API}/me`);
    if (me.session) keepSecret(me.session); // no tokens: the open daemon's secret, for changes
    state.me = me;
  } catch (err) {
    if (err.status === 401) { keepSecret(null); return showLogin(); }
    main.textContent = `The daemon refused the console: ${err.message}`;
    return;
  }
  start();
}

function showLogin() {
  const form = document.getElementById("login");
  form.hidden = false;
  form.token.focus();
  form.onsubmit = async (ev) => {
    ev.preventDefault();
    try {
      const me = await api(`${API}/login`, { method: "POST", body: { token: form.token.value } });
      keepSecret(me.session);
      delete me.session;
      state.me = me;
      form.token.value = "";
      form.hidden = true;
      document.getElementById("login-error").textContent = "";
      start();
    } catch (err) {
      document.getElementById("login-error").textContent = err.status === 401 ? "That token is not known here." : err.message;
    }
  };
}

// The session is gone: everything it showed goes with it, and the page asks for a login.
function signedOut() {
  if (!state.started) return;
  state.started = false;
  keepSecret(null);
  state.stream?.close();
  state.stream = null;
  window.removeEventListener("hashchange", route);
  leaveView();
  leaveView = () => {};
  Object.assign(state, { me: null, sessions: [], approvals: { pending: [], decided: [] }, audit: [] });
  state.cpuPrev.clear();
  main.replaceChildren();
  document.getElementById("nav").hidden = true;
  document.getElementById("who").textContent = "";
  document.getElementById("logout").hidden = true;
  document.getElementById("pending-count").textContent = "";
  showLogin();
}

function start() {
  state.started = true;
  document.getElementById("nav").hidden = false;
  const who = document.getElementById("who");
  who.textContent = `agent ${state.me.agent}` + (state.me.operator ? " · operator (all agents)" : "") + (state.me.approver ? " · approver" : "");
  const logout = document.getElementById("logout");
  logout.hidden = !state.me.tokensRequired;
  logout.onclick = async () => {
    await api(`${API}/logout`, { method: "POST" }).catch(() => {});
    keepSecret(null);
    location.reload();
  };
  openStream();
  window.addEventListener("hashchange", route);
  route();
}

function openStream() {
  state.stream = eventStream(`${API}/stream`, {
    sessions: (ev) => {
      const now = performance.now();
      state.sessions = JSON.parse(ev.data);
      for (const s of state.sessions) {
        const prev = state.cpuPrev.get(s.id);
        s.cpuPercent = prev && now > prev.t ? Math.max(0, ((s.cpuMs - prev.cpu) / (now - prev.t)) * 100) : 0;
        if (!prev || now - prev.t > 800) state.cpuPrev.set(s.id, { t: now, cpu: s.cpuMs, pct: s.cpuPercent });
        else s.cpuPercent = prev.pct;
      }
      document.dispatchEvent(new CustomEvent("pp:sessions"));
    },
    approvals: (ev) => {
      state.approvals = JSON.parse(ev.data);
      document.getElementById("pending-count").textContent = state.approvals.pending.length ? `(${state.approvals.pending.length})` : "";
      document.dispatchEvent(new CustomEvent("pp:approvals"));
    },
    audit: (ev) => {
      state.audit.push(...JSON.parse(ev.data).events);
      if (state.audit.length > AUDIT_KEEP) state.audit.splice(0, state.audit.length - AUDIT_KEEP);
      document.dispatchEvent(new CustomEvent("pp:audit"));
    },
  });
}

function route() {
  leaveView();
  leaveView = () => {};
  main.replaceChildren();
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === `#/${parts[0] || "sessions"}`);
  if (parts[0] === "session" && parts.length >= 3) sessionView(parts[1], parts[2]);
  else if (parts[0] === "approvals") approvalsView();
  else if (parts[0] === "audit") auditView();
  else sessionsView();
}

function on(name, fn) {
  document.addEventListener(name, fn);
  const previous = leaveView;
  leaveView = () => { document.removeEventListener(name, fn); previous(); };
}

// -- sessions --

function sessionsView() {
  const agent = el("select", { "aria-label": "Agent" }, el("option", { value: "" }, "all agents"));
  const status = el("select", { "aria-label": "State" },
    ...[["", "any state"], ["running", "running"], ["ended", "ended"], ["exited_ok", "exited ok"], ["exited_error", "exited with error"], ["killed", "killed"]].map(([v, t]) => el("option", { value: v }, t)));
  const search = el("input", { type: "search", placeholder: "search commands and names", "aria-label": "Search commands and names" });
  const tbody = el("tbody");
  const table = el("table", { id: "sessions" },
    el("thead", {}, el("tr", {}, ...["Agent", "Command", "Status", "Started", "Runtime", "CPU", "Memory", "Exit"].map((h) => el("th", {}, h)))), tbody);
  const empty = el("p", { class: "empty", id: "sessions-empty" }, "");
  main.append(el("h2", {}, "Sessions"), el("div", { class: "filters" }, agent, status, search), table, empty);

  function render() {
    const agents = [...new Set(state.sessions.map((s) => s.agent))].sort();
    const chosen = agent.value;
    agent.replaceChildren(el("option", { value: "" }, "all agents"), ...agents.map((a) => el("option", { value: a }, a)));
    agent.value = agents.includes(chosen) ? chosen : "";
    const q = search.value.toLowerCase();
    const rows = state.sessions.filter((s) =>
      (!agent.value || s.agent === agent.value) &&
      (!status.value || (status.value === "ended" ? ended(s) : status.value === "running" ? ["running", "restarting"].includes(s.state) : s.state === status.value)) &&
      (!q || s.command.toLowerCase().includes(q) || (s.name ?? "").toLowerCase().includes(q)));
    tbody.replaceChildren(...rows.map((s) => {
      const href = `#/session/${encodeURIComponent(s.agent)}/${encodeURIComponent(s.id)}`;
      return el("tr", { class: "row", "data-id": s.id, "data-state": s.state, onclick: () => { location.hash = href; } },
        el("td", {}, s.agent),
        el("td", { class: "cmd", title: s.command }, el("a", { href }, s.name ? el("strong", { class: "name" }, s.name) : "", s.name ? " " : "", s.command)),
        el("td", {}, el("span", { class: `state ${s.state}` }, s.state.replace("_", " "))),
        el("td", {}, clock(s.startedAt)),
        el("td", { class: "num" }, runtime(s.durationMs)),
        el("td", { class: "num" }, ended(s) ? "" : `${s.cpuPercent.toFixed(0)}%`),
        el("td", { class: "num" }, ended(s) ? (s.memoryPeakBytes ? `peak ${bytes(s.memoryPeakBytes)}` : "") : bytes(s.memoryBytes)),
        el("td", { class: "num" }, s.exit ?? s.exitCode ?? s.exitSignal ?? ""));
    }));
    // An empty table says why: no session at all, or none that the filters let through.
    empty.textContent = state.sessions.length ? `No session matches these filters (${state.sessions.length} hidden).`
      : "No sessions yet. They appear here as agents start them.";
    empty.hidden = rows.length > 0;
  }
  for (const input of [agent, status]) input.addEventListener("change", render);
  search.addEventListener("input", render);
  on("pp:sessions", render);
  render();
}

// -- one session --

function sessionView(agent, id) {
  const base = `${API}/sessions/${encodeURIComponent(agent)}/${encodeURIComponent(id)}`;
  const find = () => state.sessions.find((s) => s.id === id && s.agent === agent);
  const title = el("code", {}, "");
  const badge = el("span", { class: "state" }, "");
  const info = el("span", { class: "muted" }, "");
  const message = el("span", { class: "muted", role: "status" }, "");
  const act = (label, path, body, cls) => el("button", { type: "button", class: cls, onclick: async () => {
    try { await api(`${base}/${path}`, { method: "POST", body }); message.textContent = `${label}: sent`; if (path === "remove") location.hash = "#/sessions"; }
    catch (err) { message.textContent = `${label}: ${err.message}`; }
  } }, label);
  const buttons = [act("SIGINT", "signal", { signal: "SIGINT" }), act("SIGTERM", "signal", { signal: "SIGTERM" }),
    act("Kill", "signal", { signal: "SIGKILL" }, "danger"), act("Remove", "remove", {}, "danger")];
  const chartBox = el("div", { id: "chart" });
  main.append(el("p", {}, el("a", { href: "#/sessions" }, "← Sessions")),
    el("div", { class: "detail-head" }, el("h2", {}, title), badge, info),
    el("div", { class: "actions" }, ...buttons, message));
  const left = el("div");
  main.append(el("div", { class: "panes" }, left, el("div", {}, el("h3", {}, "CPU and memory"), chartBox)));
  const chart = makeChart(chartBox);

  let closeOutput = () => {};
  function header() {
    const s = find();
    if (!s) { badge.textContent = "gone"; return; }
    title.textContent = s.name ? `${s.name}: ${s.command}` : s.command;
    badge.className = `state ${s.state}`;
    badge.textContent = s.state.replace("_", " ");
    info.textContent = `agent ${s.agent} · pid ${s.pid ?? "-"} · ${runtime(s.durationMs)} · ${bytes(s.bytes)} of output` +
      (ended(s) ? ` · exit ${s.exit || (s.exitCode ?? s.exitSignal ?? "?")}` : "");
    for (const b of buttons.slice(0, 3)) b.disabled = ended(s);
    chart.add(s);
  }
  let shown = null;
  function build() {
    const s = find();
    if (!s || shown) return;
    shown = s.pty ? "pty" : "pipe";
    closeOutput = s.pty ? ptyPane(left, base, s) : pipePane(left, base, s);
  }
  on("pp:sessions", () => { header(); build(); });
  header();
  build();
  const previous = leaveView;
  leaveView = () => { closeOutput(); chart.destroy(); previous(); };
}

function makeChart(box) {
  const data = [[], [], []];
  let plot = null;
  if (window.uPlot) {
    plot = new window.uPlot({
      width: 320, height: 200,
      series: [{}, { label: "CPU %", stroke: "#2457c5", scale: "%" }, { label: "MiB", stroke: "#1e7a3a", scale: "mb" }],
      axes: [{}, { scale: "%" }, { scale: "mb", side: 1 }],
      scales: { x: { time: true } },
    }, data, box);
  }
  let last = 0;
  return {
    add(s) {
      const t = Date.now() / 1000;
      if (ended(s) || t - last < 0.9 || !plot) return;
      last = t;
      data[0].push(t); data[1].push(s.cpuPercent ?? 0); data[2].push(s.memoryBytes / (1 << 20));
      if (data[0].length > 600) for (const d of data) d.shift();
      if (data[0].length > 1) plot.setData(data); // one sample alone would stretch the time axis over years
    },
    destroy() { plot?.destroy(); },
  };
}

// A terminal for a pty session: output from the log, keys typed go to the session's pty.
function ptyPane(parent, base, session) {
  const box = el("div", { class: "term", id: "terminal" });
  parent.append(box);
  // The pty's own size, so full-screen programs draw as they would in a terminal of that size.
  const [cols, rows] = session.ptySize ?? [120, 30];
  const term = new Terminal({ cols, rows, convertEol: false, scrollback: 5000, fontSize: 12 });
  term.open(box);
  let pending = "";
  let timer = null;
  term.onData((data) => {
    pending += data;
    timer ??= setTimeout(async () => {
      const chunk = pending; pending = ""; timer = null;
      try { await api(`${base}/write`, { method: "POST", body: { data: chunk } }); } catch (err) { term.write(`\r\n[input refused: ${err.message}]\r\n`); }
    }, 25);
  });
  const es = eventStream(`${base}/output?from=-1`, {
    data: (ev) => term.write(b64bytes(JSON.parse(ev.data).data)),
    end: (ev) => { term.write(`\r\n[session ended: ${JSON.parse(ev.data).state}]\r\n`); es.close(); },
  });
  term.focus();
  return () => { es.close(); term.dispose(); };
}

// The output of a pipe session: a window onto the log, paged from the server by byte offset.
// Following, it shows the live tail; scrolled up, it fetches the 48 KiB at that point of the log.
// The log is never loaded whole: a scroll position maps to an offset, the server sends that page.
function pipePane(parent, base, session) {
  const WINDOW = 48 * 1024;
  const TAIL_KEEP = 64 * 1024;
  const MAX_HEIGHT = 4_000_000; // px: browsers cap element heights; a longer log maps more bytes to a pixel
  const streamSel = el("select", { "aria-label": "Stream" }, ...["combined", "stdout", "stderr"].map((v) => el("option", { value: v }, v)));
  const follow = el("input", { type: "checkbox", checked: true, id: "follow" });
  const where = el("span", { class: "muted", id: "log-where" }, "");
  const viewer = el("div", { class: "log", id: "log", tabindex: "0" });
  const spacer = el("div", { class: "spacer" });
  const pane = el("pre", { id: "log-text" });
  viewer.append(spacer, pane);
  const input = el("input", { type: "text", placeholder: "a line for its stdin", "aria-label": "Stdin" });
  const eof = el("input", { type: "checkbox", id: "eof" });
  const send = el("button", { type: "submit" }, "Send");
  const stdinForm = el("form", { class: "stdin", onsubmit: async (ev) => {
    ev.preventDefault();
    try { await api(`${base}/write`, { method: "POST", body: { data: input.value + "\n", eof: eof.checked } }); input.value = ""; }
    catch (err) { where.textContent = `stdin: ${err.message}`; }
  } }, input, el("label", { for: "eof" }, eof, " EOF"), send);
  parent.append(el("div", { class: "filters" }, streamSel, el("label", { for: "follow" }, follow, " follow the tail"), where), viewer,
    session.stdinOpen ? stdinForm : el("p", { class: "muted" }, "stdin is closed for this session."));

  let total = 0;
  let tail = ""; // the newest text, for following
  let decoder = new TextDecoder();
  let es = null;
  let seq = 0;

  const height = () => Math.max(viewer.clientHeight + 1, Math.min(MAX_HEIGHT, Math.ceil(total / 4)));
  function setHeight() { spacer.style.height = `${height()}px`; }
  function showTail() {
    const lines = tail.split("\n");
    pane.textContent = lines.slice(-Math.ceil(viewer.clientHeight / 16) - 2).join("\n");
    pane.classList.add("tail");
    setHeight();
    viewer.scrollTop = viewer.scrollHeight;
    pane.style.top = `${viewer.scrollTop}px`;
    where.textContent = `${bytes(total)} · following`;
  }
  function connect() {
    es?.close();
    decoder = new TextDecoder();
    tail = "";
    es = eventStream(`${base}/output?stream=${streamSel.value}&from=-1`, {
      data: (ev) => {
        const msg = JSON.parse(ev.data);
        total = Math.max(total, msg.end);
        tail = (tail + decoder.decode(b64bytes(msg.data), { stream: true })).slice(-TAIL_KEEP);
        if (follow.checked) showTail(); else setHeight();
      },
      end: () => { es.close(); if (follow.checked) showTail(); },
    });
  }
  async function showAt(scrollTop) {
    const span = Math.max(1, height() - viewer.clientHeight);
    const ratio = Math.min(1, scrollTop / span);
    const offset = Math.floor(ratio * Math.max(0, total - WINDOW));
    const mine = ++seq;
    const page = await api(`${base}/log?stream=${streamSel.value}&offset=${offset}&limit=${WINDOW}`);
    if (mine !== seq || follow.checked) return;
    total = Math.max(total, page.total);
    let text = new TextDecoder().decode(b64bytes(page.data));
    if (page.offset > 0) text = text.slice(text.indexOf("\n") + 1); // start on a whole line
    if (page.dropped) text = `[${bytes(page.dropped)} dropped here: the log keeps its head and tail]\n` + text;
    pane.classList.remove("tail");
    pane.style.top = `${viewer.scrollTop}px`;
    pane.textContent = text.split("\n").slice(0, Math.ceil(viewer.clientHeight / 16) + 2).join("\n");
    pane.dataset.offset = String(page.offset);
    where.textContent = `${bytes(page.offset)} of ${bytes(page.total)}`;
  }
  let scrollTimer = null;
  let programmatic = false;
  viewer.addEventListener("scroll", () => {
    if (programmatic) return;
    const atBottom = viewer.scrollTop + viewer.clientHeight >= viewer.scrollHeight - 4;
    if (atBottom) { if (!follow.checked) { follow.checked = true; showTail(); } return; }
    follow.checked = false;
    pane.style.top = `${viewer.scrollTop}px`;
    clearTimeout(scrollTimer);
    scrollTimer = setTimeout(() => showAt(viewer.scrollTop).catch((err) => { where.textContent = err.message; }), 60);
  });
  follow.addEventListener("change", () => { if (follow.checked) { programmatic = true; showTail(); programmatic = false; } });
  streamSel.addEventListener("change", () => { total = 0; follow.checked = true; connect(); });
  connect();
  return () => { es?.close(); clearTimeout(scrollTimer); };
}

// -- approvals --

function approvalsView() {
  const box = el("div");
  main.append(el("h2", {}, "Approvals"), box);
  function render() {
    if (!state.me.approver) {
      box.replaceChildren(el("p", { class: "empty" }, `Agent ${state.me.agent} is not an approver: [server] approvers names who decides.`));
      return;
    }
    const { pending, decided } = state.approvals;
    const rows = pending.map((r) => {
      const reason = el("input", { type: "text", placeholder: "reason for denying", "aria-label": "Reason" });
      const msg = el("span", { class: "muted" });
      const decide = (decision) => async () => {
        try { await api(`/v1/approvals/${encodeURIComponent(r.id)}`, { method: "POST", body: { decision, reason: reason.value || null } }); msg.textContent = decision + "d"; }
        catch (err) { msg.textContent = err.message; }
      };
      return el("tr", { class: "approval", "data-id": r.id },
        el("td", {}, r.scope), el("td", {}, r.tool), el("td", {}, el("pre", { class: "args" }, JSON.stringify(r.arguments, null, 2))),
        el("td", {}, clock(r.created_at)), el("td", { class: "chat" }, chatText(r.chat)),
        el("td", {}, el("button", { type: "button", onclick: decide("approve") }, "Approve"), reason,
          el("button", { type: "button", class: "danger", onclick: decide("deny") }, "Deny"), msg));
    });
    box.replaceChildren(
      el("h3", {}, "Waiting"),
      pending.length ? el("table", { id: "pending" }, el("thead", {}, el("tr", {}, ...["Agent", "Tool", "Arguments", "Asked", "Chat", ""].map((h) => el("th", {}, h)))), el("tbody", {}, rows))
        : el("p", { class: "empty" }, "Nothing is waiting for approval."),
      el("h3", {}, "Decided"),
      el("table", { id: "decided" }, el("thead", {}, el("tr", {}, ...["Agent", "Tool", "Summary", "Decision", "By", "Reason"].map((h) => el("th", {}, h)))),
        el("tbody", {}, decided.map((r) => el("tr", {}, el("td", {}, r.scope), el("td", {}, r.tool), el("td", { class: "cmd" }, r.summary),
          el("td", {}, el("span", { class: `state ${r.status === "approved" ? "exited_ok" : "killed"}` }, r.status)), el("td", {}, r.decided_by ?? ""), el("td", {}, r.reason ?? ""))))));
  }
  on("pp:approvals", render);
  render();
}

// The chat a call came from, as its caller said (X-Procpilot-Context): "provider=… session=…".
const chatText = (chat) => (chat ? Object.entries(chat).map(([k, v]) => `${k}=${v}`).join(" ") : "");

// -- audit --

function auditView() {
  const agent = el("input", { type: "search", placeholder: "agent", "aria-label": "Agent" });
  const tool = el("input", { type: "search", placeholder: "tool", "aria-label": "Tool" });
  const tbody = el("tbody");
  main.append(el("h2", {}, "Audit"), el("div", { class: "filters" }, agent, tool),
    el("table", { id: "audit" }, el("thead", {}, el("tr", {}, ...["Time", "Agent", "Tool", "Tier", "Outcome", "Summary", "By", "Chat"].map((h) => el("th", {}, h)))), tbody));
  function render() {
    const a = agent.value.trim(), t = tool.value.trim();
    const rows = state.audit.filter((e) => (!a || e.agent === a) && (!t || e.tool.includes(t))).slice(-500).reverse();
    tbody.replaceChildren(...rows.map((e) => el("tr", {}, el("td", {}, clock(e.at)), el("td", {}, e.agent), el("td", {}, e.tool), el("td", {}, e.tier),
      el("td", {}, e.outcome), el("td", { class: "cmd", title: e.summary }, e.summary), el("td", {}, e.decidedBy ?? ""),
      el("td", { class: "chat" }, chatText(e.chat)))));
  }
  agent.addEventListener("input", render);
  tool.addEventListener("input", render);
  on("pp:audit", render);
  render();
}

boot();
