// reach Health dashboard. Served by the CA at /assets/dashboard.js; the
// pages (/, /app, /connectors) hold no data: this script fetches one page of
// rows from the JSON API, keeps the filters in the URL, and updates rows in
// place from the server-sent change stream (/api/v1/health/stream).
'use strict';

const STATUS_LABEL = { up: 'Up', unhealthy: 'Unhealthy', down: 'Down', unknown: 'Unknown' };
const STATUS_ICON = { up: '✓', unhealthy: '!', down: '✗', unknown: '?' };
const NOTE_LABEL = {
  checked_on_access: 'checked on access',
  not_checked: 'not checked, assumed reachable',
};

// Builds an element: h('a', {href: '/'}, 'text', child…).
function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-') || k.startsWith('aria-') || k === 'role' || k === 'title' ||
             k === 'href' || k === 'datetime' || k === 'scope' || k === 'type' || k === 'tabindex') {
      e.setAttribute(k, v === true ? '' : String(v));
    } else e[k] = v;
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function badge(status) {
  return h('span', { class: `status status-${status}`, 'data-status': status },
    h('span', { class: `icon icon-${status}`, 'aria-hidden': 'true' }, STATUS_ICON[status] || '?'),
    ' ', STATUS_LABEL[status] || status);
}

// A timestamp in the operator's time zone, UTC on hover.
function when(ms) {
  if (!ms) return h('span', { class: 'muted' }, 'never');
  const d = new Date(Number(ms));
  return h('time', { datetime: d.toISOString(), title: d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC') },
    d.toLocaleString());
}

function age(ms) {
  if (ms === null || ms === undefined) return 'never';
  if (ms < 1000) return `${ms} ms ago`;
  if (ms < 120000) return `${Math.floor(ms / 1000)} s ago`;
  if (ms < 7200000) return `${Math.floor(ms / 60000)} min ago`;
  return `${Math.floor(ms / 3600000)} h ago`;
}

async function getJSON(url) {
  const r = await fetch(url, { headers: authHeaders(), credentials: 'same-origin' });
  const body = await r.json().catch(() => ({}));
  if (r.status === 401) askToken(token() ? 'The CA did not accept the token.' : 'The CA needs an API token.');
  if (!r.ok) {
    const m = body && body.error ? body.error.message : r.statusText;
    throw new Error(`${r.status}: ${m}`);
  }
  return body;
}

function appHref(a) {
  const p = new URLSearchParams({ segment: a.segment, host: a.host, protocol: a.protocol, port: String(a.port) });
  return `/app?${p}`;
}

function appKey(a) {
  return `${a.segment}/${a.host}/${a.protocol}/${a.port}`;
}

function appLabel(a) {
  return a.port ? `${a.host}:${a.port}/${a.protocol}` : `${a.host} (${a.ports || a.protocol})`;
}

// Runs `fn` at most once per `ms` (the last call is never lost): a burst
// of changes costs one re-read, not one per change.
function coalesce(fn, ms) {
  let timer = null;
  let last = 0;
  let running = false;
  let again = false;
  const fire = async () => {
    timer = null;
    last = Date.now();
    running = true;
    try { await fn(); } finally {
      running = false;
      if (again) { again = false; kick(); }
    }
  };
  const kick = () => {
    if (running) { again = true; return; }
    if (timer) return;
    timer = setTimeout(fire, Math.max(0, last + ms - Date.now()));
  };
  return kick;
}

// The API token the operator entered (this tab only), when the CA needs
// one: without `anonymous_read` and without a proxy that adds it.
const TOKEN_KEY = 'reach.token';
function token() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (_) { return ''; }
}

// A signed-in person (`GET /auth/session`): their session is a cookie;
// state changes also carry the session's CSRF token.
let signedIn = { person: null, scopes: [], csrf_token: null, providers: [] };

function authHeaders(extra) {
  const t = token();
  const csrf = !t && signedIn.csrf_token ? { 'X-CSRF-Token': signedIn.csrf_token } : {};
  return Object.assign({ Accept: 'application/json' }, t ? { Authorization: `Bearer ${t}` } : csrf, extra || {});
}

// Shows who is signed in (and a sign-out control), or a sign-in link when
// the CA has an OpenID provider.
async function whoami() {
  try {
    const r = await fetch('/auth/session', { headers: { Accept: 'application/json' }, credentials: 'same-origin' });
    if (r.ok) signedIn = await r.json();
  } catch (_) { /* the listing shows the CA's state */ }
  const who = document.getElementById('who');
  if (!who) return;
  who.textContent = '';
  if (signedIn.person) {
    const out = h('button', { type: 'button', id: 'sign-out' }, 'Sign out');
    out.addEventListener('click', async () => {
      await fetch('/auth/logout', {
        method: 'POST', credentials: 'same-origin',
        headers: { Accept: 'application/json', 'X-CSRF-Token': signedIn.csrf_token || '' },
      }).catch(() => null);
      location.assign('/');
    });
    who.append(h('span', { id: 'signed-in-as' }, signedIn.person), ' ', out);
  } else if ((signedIn.providers || []).length) {
    const next = location.pathname + location.search;
    who.append(h('a', { id: 'sign-in', href: `/auth/login?${new URLSearchParams({ next })}` }, 'Sign in'));
  }
}

// Asks for a read token (shown when the CA answered 401), kept in this
// tab's sessionStorage; the page then reloads its data.
function askToken(message) {
  if (document.getElementById('token-form')) return;
  const input = h('input', { type: 'password', name: 'token', id: 'token', autocomplete: 'off' });
  const form = h('form', { id: 'token-form', class: 'token-form' },
    h('p', {}, message, (signedIn.providers || []).length ? ' Sign in (top right), or enter' : ' Enter',
      ' an API token with the read scope (kept in this tab only).'),
    h('label', {}, 'API token ', input), ' ', h('button', { type: 'submit' }, 'Use token'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    try { sessionStorage.setItem(TOKEN_KEY, input.value.trim()); } catch (_) { /* private mode */ }
    location.reload();
  });
  const main = document.getElementById('main');
  main.insertBefore(form, main.children[1] || null);
  input.focus();
}

// Opens the change stream. EventSource cannot send a token, so the page
// first obtains a one-time stream ticket with it (`POST
// /api/v1/health/stream/ticket`) and passes that in the URL; a new ticket
// is fetched whenever the stream has to be reopened. `onOpen` runs every
// time the stream opens (the first time too) with the stream's version
// and epoch: changes between the page's fetch and the opening are not in
// the stream, so the page re-reads when it may have missed one. A version
// counts within one CA process only (the epoch is new in each): a stream
// of another epoch (the CA restarted, or this browser reached another
// replica) means a re-read whatever the numbers say. A `lagged` event
// (this page fell behind) counts as an opening with version null.
//
// Over HTTP/1.1 a browser holds at most 6 connections to a host and a
// stream holds one for good: one stream per tab would leave a 7th tab
// unable to load. There the tabs share one stream through a SharedWorker
// (/assets/dashboard-stream.js); over HTTP/2 (and where SharedWorker is
// missing) each tab opens its own.
function live(handlers) {
  const nav = performance.getEntriesByType('navigation')[0];
  const proto = nav ? nav.nextHopProtocol : '';
  const multiplexed = proto === 'h2' || proto === 'h3';
  if (!multiplexed && typeof SharedWorker === 'function' && sharedLive(handlers)) return;
  ownLive(handlers);
}

// Whether this tab's stream is the browser's shared one (the indicator's
// `data-shared`).
let liveShared = false;

function liveIndicator(state, text) {
  const indicator = document.getElementById('live');
  if (!indicator) return;
  indicator.dataset.live = state;
  indicator.dataset.shared = String(liveShared);
  indicator.textContent = text;
}

// Joins the browser's shared stream; false when the worker cannot start
// (the caller then opens its own).
function sharedLive({ onOpen, onTransition }) {
  let worker;
  try {
    worker = new SharedWorker('/assets/dashboard-stream.js', { name: 'reach-stream' });
  } catch (_) {
    return false;
  }
  liveShared = true;
  let heard = false;
  const port = worker.port;
  port.addEventListener('message', (ev) => {
    heard = true;
    const m = ev.data || {};
    if (m.type === 'state') liveIndicator(m.state, m.text);
    else if (m.type === 'open') { if (onOpen) onOpen(m.version, m.epoch); }
    else if (m.type === 'transition') { if (m.transition && onTransition) onTransition(m.transition); }
  });
  // A worker that fails to start (never spoke): this tab opens its own.
  worker.addEventListener('error', () => {
    if (heard) return;
    heard = true;
    liveShared = false;
    port.close();
    ownLive({ onOpen, onTransition });
  });
  port.start();
  port.postMessage({ type: 'join', token: token(), csrf: signedIn.csrf_token || '' });
  window.addEventListener('pagehide', () => port.postMessage({ type: 'leave' }));
  window.addEventListener('pageshow', (ev) => {
    if (ev.persisted) port.postMessage({ type: 'join', token: token(), csrf: signedIn.csrf_token || '' });
  });
  return true;
}

function ownLive({ onOpen, onTransition }) {
  const set = liveIndicator;
  let retry = 1000;
  const open = async () => {
    let ticket;
    try {
      const r = await fetch('/api/v1/health/stream/ticket', {
        method: 'POST', credentials: 'same-origin',
        headers: authHeaders({ 'Content-Type': 'application/json' }), body: '{}',
      });
      if (r.status === 401) { set('offline', 'not live: no token'); return; }
      if (!r.ok) throw new Error(String(r.status));
      ticket = (await r.json()).ticket;
    } catch (_) {
      set('reconnecting', 'reconnecting…');
      setTimeout(open, retry);
      retry = Math.min(retry * 2, 30000);
      return;
    }
    const source = new EventSource(`/api/v1/health/stream?${new URLSearchParams({ ticket })}`);
    source.addEventListener('hello', (ev) => {
      retry = 1000;
      set('live', 'live');
      let v = null;
      let e = null;
      try { ({ version: v, epoch: e } = JSON.parse(ev.data)); } catch (_) { /* ignored */ }
      if (onOpen) onOpen(v === undefined ? null : v, e || null);
    });
    source.addEventListener('transition', (ev) => {
      let t = null;
      try { t = JSON.parse(ev.data); } catch (_) { /* ignored */ }
      if (t && onTransition) onTransition(t);
    });
    source.addEventListener('lagged', () => { if (onOpen) onOpen(null, null); });
    source.addEventListener('error', () => {
      set('reconnecting', 'reconnecting…');
      // The ticket was used: reopen with a new one rather than let the
      // browser retry the same URL.
      source.close();
      setTimeout(open, retry);
      retry = Math.min(retry * 2, 30000);
    });
  };
  open();
}

const RANK = { up: 3, unhealthy: 2, down: 1, unknown: 0 };

// Applies a streamed transition to an application's row data: the
// connector's status, the overall status (the best over connectors), the
// latest change.
function applyTransition(a, t) {
  let c = a.connectors.find((x) => x.connector === t.connector);
  if (!c && a.note !== 'not_checked') {
    c = { connector: t.connector, group: '', addresses: [] };
    a.connectors.push(c);
  }
  if (c) {
    c.status = t.to;
    c.unknown_cause = t.to === 'unknown' ? t.cause : null;
  }
  if (a.note === 'checked_on_access') a.note = undefined;
  if (a.note !== 'not_checked') {
    a.status = a.connectors.reduce((best, x) => (RANK[x.status] > RANK[best] ? x.status : best), 'unknown');
  }
  a.transitions.push({ at: t.at, connector: t.connector, from: t.from, to: t.to, cause: t.cause });
}

function transitionKey(t) {
  return `${t.segment}/${t.host}/${t.protocol}/${t.port}`;
}

// ---- Applications list (/) -------------------------------------------------

const LIST_FIELDS = ['q', 'status', 'mode', 'segment', 'group', 'connector', 'per_page'];

function listParams() {
  const p = new URLSearchParams(location.search);
  for (const [k, v] of [...p.entries()]) if (!v) p.delete(k);
  return p;
}

function setListParams(p) {
  const url = p.toString() ? `/?${p}` : '/';
  history.pushState(null, '', url);
}

function countLink(label, status, n, href) {
  return h('a', { class: `count status-${status}`, href, 'data-count': status },
    h('span', { class: 'n' }, String(n)), ' ', label);
}

function renderOverview(o) {
  const box = document.getElementById('overview');
  if (!box) return;
  const a = o.applications;
  const c = o.connectors;
  box.replaceChildren(
    h('div', { class: 'card', 'data-overview': 'applications' },
      h('h2', {}, `Applications (${o.applications_total})`),
      h('div', { class: 'counts' },
        countLink('Down', 'down', a.down, '/?status=down'),
        countLink('Unhealthy', 'unhealthy', a.unhealthy, '/?status=unhealthy'),
        countLink('Unknown ?', 'unknown', a.unknown, '/?status=unknown'),
        countLink('Up', 'up', a.up, '/?status=up'))),
    h('div', { class: 'card', 'data-overview': 'connectors' },
      h('h2', {}, `Connectors (${c.total})`),
      h('div', { class: 'counts' },
        countLink('Connected', 'up', c.connected, '/connectors?state=connected'),
        countLink('Disconnected', 'down', c.disconnected, '/connectors?state=disconnected'),
        countLink('Over budget', 'unhealthy', c.over_budget, '/connectors?over_budget=1'),
        countLink('Drained', 'unknown', c.drained || 0, '/connectors?state=drained'))));
}

function connectorCells(a) {
  if (a.note) {
    return [h('span', { class: 'note', 'data-note': a.note },
      a.note === 'checked_on_access' ? badge('unknown') : '', ' ', NOTE_LABEL[a.note] || a.note)];
  }
  if (!a.connectors.length) return [noConnector(a)];
  const shown = a.connectors.slice(0, 8).map((c) =>
    h('span', { class: 'conn', 'data-connector': c.connector, title: c.unknown_cause ? c.unknown_cause.replace(/_/g, ' ') : '' },
      badge(c.status), ' ', c.connector));
  if (a.connectors.length > 8) shown.push(h('span', { class: 'muted' }, `+${a.connectors.length - 8} more`));
  return shown;
}

// Why an application has no per-connector status: no connector of its
// segment's groups is known, or (a CA that has just started) the enrolled
// ones have not connected yet.
function noConnector(a) {
  const n = a.enrolled_unconnected;
  if (n) {
    return h('span', { class: 'muted', 'data-unconnected': String(n) },
      `${n} enrolled connector${n === 1 ? '' : 's'} of the segment's groups ${n === 1 ? 'is' : 'are'} not connected`);
  }
  return h('span', { class: 'muted' }, "no connector in the segment's groups");
}

// One row's cells that change (the link cell stays, so focus stays on it).
function fillRow(tr, a) {
  const sig = JSON.stringify([a.status, a.note, a.connectors.map((c) => [c.connector, c.status]),
    a.transitions.length ? a.transitions[a.transitions.length - 1].at : 0, a.enrolled_unconnected]);
  if (tr.dataset.sig === sig) return;
  tr.dataset.sig = sig;
  tr.dataset.status = a.status;
  const last = a.transitions.length ? a.transitions[a.transitions.length - 1] : null;
  tr.cells[2].replaceChildren(badge(a.status));
  tr.cells[3].replaceChildren(...connectorCells(a));
  tr.cells[4].replaceChildren(last ? h('span', {}, when(last.at), ' ',
    h('span', { class: 'muted' }, `${last.connector}: ${last.from} → ${last.to}`)) : h('span', { class: 'muted' }, '—'));
}

function newRow(a) {
  const tr = h('tr', { class: 'application', 'data-app': appKey(a), 'data-segment': a.segment,
    'data-host': a.host, 'data-protocol': a.protocol, 'data-port': a.port },
  h('td', {}, a.segment, h('br'), h('span', { class: 'muted' }, a.health_reporting.replace('_', ' '))),
  h('td', {}, h('a', { href: appHref(a), class: 'app-link' }, appLabel(a))),
  h('td', {}), h('td', {}), h('td', {}));
  fillRow(tr, a);
  return tr;
}

// Puts `apps` into the table, reusing rows by key and keeping focus.
function renderRows(tbody, apps) {
  const focused = document.activeElement;
  const focusedRow = focused && focused.closest ? focused.closest('tr[data-app]') : null;
  const existing = new Map([...tbody.querySelectorAll('tr[data-app]')].map((r) => [r.dataset.app, r]));
  const rows = apps.map((a) => {
    const r = existing.get(appKey(a));
    if (r) { existing.delete(appKey(a)); fillRow(r, a); return r; }
    return newRow(a);
  });
  for (const r of existing.values()) r.remove();
  for (const e of [...tbody.children]) if (!e.dataset.app) e.remove();
  rows.forEach((r, i) => { if (tbody.children[i] !== r) tbody.insertBefore(r, tbody.children[i] || null); });
  if (!apps.length) tbody.append(h('tr', {}, h('td', { colSpan: 5, class: 'muted' }, 'No applications match.')));
  if (focusedRow && focusedRow.isConnected && document.activeElement !== focused) focused.focus({ preventScroll: true });
}

function renderPager(nav, body, go) {
  const prev = h('button', { type: 'button', disabled: body.page <= 1 }, '← Previous');
  const next = h('button', { type: 'button', disabled: body.page >= body.pages }, 'Next →');
  prev.addEventListener('click', () => go(body.page - 1));
  next.addEventListener('click', () => go(body.page + 1));
  nav.replaceChildren(prev, h('span', {}, `Page ${body.page} of ${body.pages}`), next);
}

function listPage() {
  const form = document.getElementById('filters');
  const tbody = document.querySelector('#applications tbody');
  // The data of the rows shown, by key: streamed transitions update them.
  const shown = new Map();
  // The stream version the shown data includes, and the epoch it counts
  // in (null: unknown).
  let version = null;
  let epoch = null;
  // Whether the first load finished.
  let loaded = false;
  // The version and epoch a stream opening named before the first data
  // arrived: the first load compares with them when done (re-reading at
  // once would fetch the first page twice on every load).
  let openedAt = null;
  // Whether data read at `version` under `epoch` may miss what a stream
  // opened at `v` under `e` did not deliver.
  const stale = (v, e) => v === null || epoch === null || e !== epoch || v > version;
  const fill = () => {
    const p = listParams();
    for (const f of LIST_FIELDS) {
      const el = form.elements[f];
      if (!el) continue;
      const v = p.get(f) || (f === 'per_page' ? '50' : '');
      if (el.tagName === 'SELECT' && v && ![...el.options].some((o) => o.value === v)) el.append(h('option', { value: v }, v));
      el.value = v;
    }
    const sort = p.get('sort') || 'host';
    const order = p.get('order') || 'asc';
    for (const th of document.querySelectorAll('#applications th')) {
      const b = th.querySelector('button[data-sort]');
      th.setAttribute('aria-sort', b && b.dataset.sort === sort ? (order === 'desc' ? 'descending' : 'ascending') : 'none');
    }
  };
  const load = async () => {
    const p = listParams();
    if (!p.get('per_page')) p.set('per_page', '50');
    if (!p.get('page')) p.set('page', '1');
    // The list shows per connector its status only: no addresses, and
    // only the latest transition (a fraction of the bytes at 500 connectors).
    p.set('view', 'summary');
    try {
      const [body, overview] = await Promise.all([getJSON(`/api/v1/health?${p}`), getJSON('/api/v1/overview')]);
      // A page past the last (a bookmark, or rows that left the filter
      // meanwhile) shows the last page instead of "Page 23 of 22" and no rows.
      if (body.total > 0 && body.page > body.pages) {
        const q = listParams();
        q.set('page', String(body.pages));
        history.replaceState(null, '', `/?${q}`);
        fill();
        return load();
      }
      // Two answers of different CA processes (a restart between them, or
      // two replicas) have no version in common.
      const same = body.epoch === overview.epoch;
      version = same ? Math.min(body.version, overview.version) : null;
      epoch = same && body.epoch ? body.epoch : null;
      loaded = true;
      if (openedAt !== null) {
        if (stale(openedAt.version, openedAt.epoch)) refresh();
        openedAt = null;
      }
      renderOverview(overview);
      shown.clear();
      for (const a of body.applications) shown.set(appKey(a), a);
      renderRows(tbody, body.applications);
      // The first rows on screen (the benchmark's "interactive" mark).
      if (!performance.getEntriesByName('reach-rows').length) performance.mark('reach-rows');
      const c = body.counts;
      document.getElementById('summary').textContent =
        `${body.total} application${body.total === 1 ? '' : 's'} match (down ${c.down}, unhealthy ${c.unhealthy}, unknown ${c.unknown}, up ${c.up}).`;
      renderPager(document.getElementById('pager'), body, (page) => {
        const q = listParams();
        q.set('page', String(page));
        setListParams(q);
        load();
      });
    } catch (e) {
      document.getElementById('summary').textContent = `Cannot load: ${e.message}`;
    }
  };
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const p = listParams();
    for (const f of LIST_FIELDS) {
      const v = (form.elements[f] && form.elements[f].value || '').trim();
      if (v && !(f === 'per_page' && v === '50')) p.set(f, v); else p.delete(f);
    }
    p.delete('page');
    setListParams(p);
    load();
  });
  for (const b of document.querySelectorAll('#applications button[data-sort]')) {
    b.addEventListener('click', () => {
      const p = listParams();
      const same = (p.get('sort') || 'host') === b.dataset.sort;
      p.set('sort', b.dataset.sort);
      p.set('order', same && (p.get('order') || 'asc') === 'asc' ? 'desc' : 'asc');
      p.delete('page');
      setListParams(p);
      fill();
      load();
    });
  }
  window.addEventListener('popstate', () => { fill(); load(); });
  // Keyboard: "/" searches, j/k move between rows, Enter opens (a link).
  document.addEventListener('keydown', (ev) => {
    if (ev.target.closest && ev.target.closest('input, select, textarea')) return;
    if (ev.key === '/') { ev.preventDefault(); form.elements.q.focus(); return; }
    if (ev.key !== 'j' && ev.key !== 'k') return;
    const links = [...tbody.querySelectorAll('a.app-link')];
    if (!links.length) return;
    const i = links.indexOf(document.activeElement);
    const j = i < 0 ? 0 : Math.max(0, Math.min(links.length - 1, i + (ev.key === 'j' ? 1 : -1)));
    links[j].focus();
    ev.preventDefault();
  });
  // A change updates its row at once from the stream's data; the counts,
  // the rows that enter or leave the filter and the order follow with one
  // re-read per 2 s at most, however many changes arrive.
  const refresh = coalesce(load, 2000);
  fill();
  load();
  live({
    onOpen: (v, e) => {
      // Opened before the first data arrived: that load decides.
      if (v !== null && !loaded) openedAt = { version: v, epoch: e };
      else if (stale(v, e)) refresh();
    },
    onTransition: (t) => {
      const a = shown.get(transitionKey(t));
      if (a) {
        applyTransition(a, t);
        const tr = [...tbody.querySelectorAll('tr[data-app]')].find((r) => r.dataset.app === appKey(a));
        if (tr) fillRow(tr, a);
      }
      refresh();
    },
  });
}

// ---- Line charts (/app, /connectors) ----------------------------------------

const SVG_NS = 'http://www.w3.org/2000/svg';
const CHART = { w: 300, h: 60, pad: 3 };

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, String(v));
  }
  for (const c of children.flat()) if (c) e.append(c);
  return e;
}

// A line chart of one series as the API gives it (`values[i]` is of the
// interval starting at `start + i * interval_ms`, null where nothing was
// recorded): one polyline per run of values, a dot for a lone value,
// scaled to the series' span and to 0..the highest value (or `line`, a
// horizontal line such as the budget, when higher). The chart carries
// its scale (`data-max`, `data-n`) so a test can map points back.
function lineChart(s, values, { label, unit, line }) {
  const n = values.length;
  const shown = values.filter((v) => v !== null);
  const max = Math.max(line || 0, ...shown) || 1;
  const x = (i) => (n > 1 ? CHART.pad + (i / (n - 1)) * (CHART.w - 2 * CHART.pad) : CHART.w / 2);
  const y = (v) => CHART.h - CHART.pad - (v / max) * (CHART.h - 2 * CHART.pad);
  const xy = (i) => `${x(i).toFixed(2)},${y(values[i]).toFixed(2)}`;
  const marks = [];
  let run = [];
  const flush = () => {
    if (run.length === 1) marks.push(svg('circle', { class: 'dot', cx: x(run[0]).toFixed(2), cy: y(values[run[0]]).toFixed(2), r: 2 }));
    else if (run.length) marks.push(svg('polyline', { class: 'line', points: run.map(xy).join(' ') }));
    run = [];
  };
  values.forEach((v, i) => { if (v === null) flush(); else run.push(i); });
  flush();
  if (line !== undefined) {
    marks.unshift(svg('line', { class: 'limit', x1: 0, x2: CHART.w, y1: y(line).toFixed(2), y2: y(line).toFixed(2), 'data-value': line }));
  }
  const last = shown.length ? shown[shown.length - 1] : null;
  const title = `${label}: ${shown.length} values from ${new Date(s.start).toLocaleString()}, every ${s.interval_ms / 60000} min` +
    (last !== null ? `; latest ${last}${unit}` : '') + (line !== undefined ? `; budget ${line}${unit}` : '');
  return svg('svg', { class: 'chart', viewBox: `0 0 ${CHART.w} ${CHART.h}`, preserveAspectRatio: 'none', role: 'img',
    'aria-label': title, 'data-n': n, 'data-points': shown.length, 'data-max': max, 'data-start': s.start,
    'data-interval-ms': s.interval_ms }, svg('title', {}, title), marks);
}

// ---- One application (/app) ------------------------------------------------

// Every address the application has had: in an answer now, or left.
function addressRows(list) {
  if (!list.length) return [h('tr', {}, h('td', { colSpan: 5, class: 'muted' }, 'No address reported.'))];
  return list.map((a) => h('tr', { class: a.left ? 'address-row left' : 'address-row', 'data-address': a.address,
    'data-status': a.status, 'data-left': a.left ? String(a.left) : null, 'data-appeared': String(a.appeared) },
  h('td', {}, a.address),
  h('td', {}, badge(a.status)),
  h('td', {}, when(a.appeared)),
  h('td', {}, a.left ? when(a.left) : h('span', { class: 'muted' }, 'in the answer')),
  h('td', {}, a.connector, ' ', h('span', { class: 'muted' }, when(a.last_seen)))));
}

// Each connector's smoothed RTT over the last hour, one chart each.
function rttCharts(series) {
  if (!series.length) return [h('p', { class: 'muted' }, 'No reachable result in the last hour.')];
  return series.map((s) => {
    const shown = s.rtt_ms.filter((v) => v !== null);
    const last = shown[shown.length - 1];
    return h('figure', { class: 'rtt-chart', 'data-connector': s.connector },
      h('figcaption', {}, s.connector, h('span', { class: 'muted' }, ` · ${last.toFixed(2)} ms now, up to ${Math.max(...shown).toFixed(2)} ms`)),
      lineChart(s, s.rtt_ms, { label: `${s.connector} smoothed RTT`, unit: ' ms' }));
  });
}

function historyRow(e, fresh) {
  return h('tr', { class: fresh ? 'event new' : 'event', 'data-to': e.to, 'data-connector': e.connector },
    h('td', {}, when(e.at)),
    h('td', {}, e.connector),
    h('td', {}, badge(e.from), ' → ', badge(e.to)),
    h('td', {}, e.cause.replace(/_/g, ' ')));
}

// ---- Status timeline (/app) -------------------------------------------------

const TIMELINE_WINDOWS = { hour: 3600000, day: 86400000, week: 604800000 };

// Each connector's spans of one status over [start, end] from `events`
// (newest first, as the API lists them): before a connector's first
// change in the window, the status that change left; with no change, its
// status now (`current`). `partial`: older changes were not read (more
// than one page), so the time before the oldest read is unknown.
function timelineSpans(events, current, start, end, partial) {
  const by = new Map(Object.entries(current).map(([c]) => [c, []]));
  for (const e of [...events].reverse()) {
    if (!by.has(e.connector)) by.set(e.connector, []);
    by.get(e.connector).push(e);
  }
  const oldest = events.length ? events[events.length - 1].at : end;
  const out = new Map();
  for (const [conn, evs] of by) {
    const spans = [];
    let from = start;
    let status = evs.length ? evs[0].from : (current[conn] || 'unknown');
    if (partial && evs.length) {
      spans.push({ from: start, to: oldest, status: 'unknown', gap: true });
      from = oldest;
    }
    for (const e of evs) {
      const at = Math.max(start, Math.min(end, e.at));
      if (at > from) spans.push({ from, to: at, status });
      from = at;
      status = e.to;
    }
    if (end > from) spans.push({ from, to: end, status });
    out.set(conn, spans);
  }
  return out;
}

// One connector's strip: spans placed by CSSOM left/width in percent of
// the window (allowed by the CSP, unlike a style attribute), at least one
// pixel wide (CSS) so a brief change stays visible.
function timelineStrip(conn, spans, start, end) {
  const strip = h('div', { class: 'strip', role: 'img', 'data-connector': conn,
    'aria-label': `${conn}: ${spans.map((x) => STATUS_LABEL[x.status] || x.status).join(', then ')}` });
  for (const x of spans) {
    const seg = h('span', { class: x.gap ? 'seg gap' : 'seg', 'data-status': x.status,
      'data-from': String(x.from), 'data-to': String(x.to),
      title: `${STATUS_LABEL[x.status] || x.status}${x.gap ? ' (older changes not loaded)' : ''}: ${new Date(x.from).toLocaleString()} – ${new Date(x.to).toLocaleString()}` });
    seg.style.left = `${((x.from - start) / (end - start)) * 100}%`;
    seg.style.width = `${((x.to - x.from) / (end - start)) * 100}%`;
    strip.append(seg);
  }
  return h('div', { class: 'timeline-row' }, h('span', { class: 'timeline-name' }, conn), strip);
}

function appPage() {
  const q = new URLSearchParams(location.search);
  const key = { segment: q.get('segment') || '', host: q.get('host') || '', protocol: q.get('protocol') || 'tcp', port: q.get('port') || '0' };
  const appParam = `${key.segment}/${key.host}/${key.protocol}/${key.port}`;
  let historyPage = 1;
  // Each connector's status now (the timeline's status without changes).
  let current = {};
  // The stream version and epoch the application's data includes (null:
  // unknown), and one a stream opening named before the first data came.
  let version = null;
  let epoch = null;
  let loaded = false;
  let openedAt = null;
  const stale = (v, e) => v === null || epoch === null || e !== epoch || v > version;
  const loadApp = async () => {
    const box = document.getElementById('app');
    const tbody = document.querySelector('#app-connectors tbody');
    try {
      const body = await getJSON(`/api/v1/application?${new URLSearchParams(key)}`);
      const a = body.application;
      version = body.version === undefined ? null : body.version;
      epoch = body.epoch || null;
      current = Object.fromEntries(a.connectors.map((c) => [c.connector, c.status]));
      document.getElementById('rtt').replaceChildren(...rttCharts(body.rtt_series || []));
      document.querySelector('#app-addresses tbody').replaceChildren(...addressRows(body.address_history || []));
      document.title = `reach — ${appLabel(a)}`;
      box.replaceChildren(
        h('h2', { 'data-app': appKey(a) }, appLabel(a), ' ', badge(a.status)),
        h('p', { class: 'muted' }, `segment ${a.segment} · ${a.health_reporting.replace('_', ' ')}`,
          a.note ? ` · ${NOTE_LABEL[a.note] || a.note}` : ''));
      tbody.replaceChildren(...a.connectors.map((c) => h('tr', { 'data-connector': c.connector, 'data-status': c.status },
        h('td', {}, c.connector, h('br'), h('span', { class: 'muted' }, c.group)),
        h('td', {}, badge(c.status), c.unknown_cause ? h('div', { class: 'muted' }, c.unknown_cause.replace(/_/g, ' ')) : '',
          // The smoothed RTT the `nearest` strategy compares.
          c.smoothed_rtt_ms !== null && c.smoothed_rtt_ms !== undefined
            ? h('div', { class: 'muted rtt', 'data-rtt-ms': String(c.smoothed_rtt_ms), title: 'smoothed round-trip time (what the nearest strategy compares)' },
              `smoothed RTT ${c.smoothed_rtt_ms.toFixed(2)} ms`)
            : ''),
        h('td', {}, c.dns_error ? h('div', { class: 'error' }, `DNS: ${c.dns_error}`) : '',
          c.addresses.length ? h('ul', { class: 'addresses' }, c.addresses.map((ad) =>
            h('li', { class: 'address', 'data-address': ad.address, 'data-status': ad.status, 'data-method': ad.method },
              `${ad.address} · ${ad.method}`,
              ad.rtt_ms !== null ? ` · ${ad.rtt_ms.toFixed(2)} ms` : '',
              ad.error ? h('span', { class: 'error' }, ` · ${ad.error}`) : '',
              // A tls/https check's certificate; a warning changes no status.
              ad.certificate_not_after != null
                ? h('span', { class: ad.certificate_warning ? 'cert cert-warn' : 'cert muted', 'data-cert-not-after': String(ad.certificate_not_after) },
                  ` · certificate until ${new Date(ad.certificate_not_after * 1000).toISOString().slice(0, 10)}`,
                  ad.certificate_warning ? ` (${ad.certificate_warning})` : '')
                : ''))) : h('span', { class: 'muted' }, '—')),
        h('td', {}, age(c.checked_age_ms)),
        h('td', {}, when(c.reported_at)))));
      if (!a.connectors.length) {
        tbody.append(h('tr', {}, h('td', { colSpan: 5, class: 'muted' },
          a.note || !a.enrolled_unconnected ? 'No connector results.' : noConnector(a))));
      }
      // Flap damping: the history lists damped transitions only.
      const note = document.getElementById('history-note');
      note.textContent = 'Every status change of a connector for this application, newest first.';
      if (a.damping) {
        note.dataset.rise = String(a.damping.rise);
        note.dataset.fall = String(a.damping.fall);
        note.append(` Damped (segment rise ${a.damping.rise}, fall ${a.damping.fall}): a connector's status gets worse only after ${a.damping.fall} worse checks in a row and better only after ${a.damping.rise} better ones, so an address shown Down under an Up status is a change not yet confirmed.`);
      }
    } catch (e) {
      box.replaceChildren(h('p', { class: 'error' }, `Cannot load: ${e.message}`));
    }
  };
  const loadHistory = async () => {
    const tbody = document.querySelector('#history tbody');
    try {
      const body = await getJSON(`/api/v1/events?${new URLSearchParams({ app: appParam, page: String(historyPage), per_page: '50' })}`);
      tbody.replaceChildren(...body.events.map((e) => historyRow(e, false)));
      if (!body.events.length) tbody.append(h('tr', { class: 'empty' }, h('td', { colSpan: 4, class: 'muted' }, 'No status change recorded.')));
      renderPager(document.getElementById('history-pager'), body, (p) => { historyPage = p; loadHistory(); });
    } catch (e) {
      tbody.replaceChildren(h('tr', {}, h('td', { colSpan: 4, class: 'error' }, `Cannot load: ${e.message}`)));
    }
  };
  const windowSelect = document.getElementById('timeline-window');
  // The window's changes read (newest first), whether older ones were
  // left unread, and from when they were read: streamed changes join
  // them, so a change redraws without a read.
  let timeline = null;
  const drawTimeline = () => {
    const box = document.getElementById('timeline');
    if (!timeline) return;
    const span = TIMELINE_WINDOWS[windowSelect.value] || TIMELINE_WINDOWS.hour;
    const end = Date.now();
    const start = Math.max(end - span, timeline.since);
    const spans = timelineSpans(timeline.events.filter((e) => e.at >= start), current, start, end, timeline.partial);
    box.dataset.start = String(start);
    box.dataset.end = String(end);
    box.replaceChildren(...[...spans].sort(([x], [y]) => x.localeCompare(y, undefined, { numeric: true }))
      .map(([conn, s]) => timelineStrip(conn, s, start, end)),
    h('div', { class: 'timeline-axis muted' }, h('span', {}, when(start)), h('span', {}, 'now')));
    if (!spans.size) box.replaceChildren(h('p', { class: 'muted' }, 'No connector.'));
  };
  const loadTimeline = async () => {
    const box = document.getElementById('timeline');
    const since = Date.now() - (TIMELINE_WINDOWS[windowSelect.value] || TIMELINE_WINDOWS.hour);
    try {
      // One page of the newest 1,000 changes in the window.
      const body = await getJSON(`/api/v1/events?${new URLSearchParams({ app: appParam, since: String(since), per_page: '1000' })}`);
      timeline = { events: body.events, partial: body.total > body.events.length, since };
      drawTimeline();
    } catch (e) {
      box.replaceChildren(h('p', { class: 'error' }, `Cannot load: ${e.message}`));
    }
  };
  const loadAll = async () => {
    await loadApp();
    await Promise.all([historyPage === 1 ? loadHistory() : null, loadTimeline()]);
  };
  // The first load: the application, then its history and timeline once
  // each; a stream that opened meanwhile re-reads only if it may carry a
  // change the data missed.
  (async () => {
    await loadApp();
    loaded = true;
    await Promise.all([loadHistory(), loadTimeline()]);
    if (openedAt !== null && stale(openedAt.version, openedAt.epoch)) reloadAll();
    openedAt = null;
  })();
  windowSelect.addEventListener('change', () => loadTimeline());
  // The RTT charts gain a value a minute without any status change.
  setInterval(() => { if (document.visibilityState === 'visible') reloadApp(); }, 60000);
  // The window moves on: redrawn every minute.
  setInterval(drawTimeline, 60000);
  // Only this application's changes matter here: its history row is
  // prepended at once, its per-connector detail and timeline re-read
  // (once per second at most).
  const reloadApp = coalesce(loadApp, 1000);
  const reloadAll = coalesce(loadAll, 1000);
  live({
    onOpen: (v, e) => {
      if (v !== null && !loaded) openedAt = { version: v, epoch: e };
      else if (!loaded) openedAt = { version: null, epoch: null };
      else if (stale(v, e)) reloadAll();
    },
    onTransition: (t) => {
      if (t.segment !== key.segment || t.host !== key.host || t.protocol !== key.protocol || String(t.port) !== key.port) return;
      reloadApp();
      if (timeline) {
        timeline.events.unshift({ at: t.at, connector: t.connector, from: t.from, to: t.to });
        drawTimeline();
      }
      if (historyPage !== 1) return;
      const tbody = document.querySelector('#history tbody');
      for (const e of tbody.querySelectorAll('tr.empty')) e.remove();
      tbody.prepend(historyRow(t, true));
    },
  });
}

// ---- Connectors (/connectors) ----------------------------------------------

// A load bar (CSSOM width: allowed by the CSP, unlike a style attribute).
function bar(ratio, over) {
  const fill = h('span', {});
  fill.style.width = `${Math.round(ratio * 100)}%`;
  return h('span', { class: over ? 'bar over' : 'bar', role: 'img', 'aria-label': `${Math.round(ratio * 100)}% of budget` }, fill);
}

// A connector's session: "connected" (a session, not an application's
// status, so no status badge), or when it was last seen.
function session(c) {
  if (c.connected) {
    return h('span', { class: 'session status-up', 'data-session': 'connected' }, '● connected since ', when(c.connected_since));
  }
  if (c.last_seen) {
    return h('span', { class: 'session status-down', 'data-session': 'disconnected' }, '○ disconnected; last seen ', when(c.last_seen));
  }
  return h('span', { class: 'session muted', 'data-session': 'never' }, '○ not connected since the CA started');
}

// A connector's drain: selected for no new access since when, by whom (an
// administrator, or the connector itself while it shuts down), or nothing.
function drained(c) {
  const d = c.drained;
  if (!d) return '';
  const by = d.by.kind === 'connector' ? 'itself, shutting down' : `${d.by.kind} ${d.by.name}`;
  return h('div', { class: 'drained', 'data-drained-by': d.by.kind },
    '⏸ drained since ', when(d.since), ` by ${by}`, d.until ? [', until ', when(d.until)] : '');
}

// A figure of a connector's load: as is when connected, dated "last
// seen …" when not (it is what the connector reported then).
function lastSeen(c, text) {
  if (c.connected) return text;
  return h('span', { class: 'muted stale', 'data-stale': 'true' }, 'last seen ', when(c.last_seen), `: ${text}`);
}

function checkLoad(c, budget) {
  if (!c.connected && !c.last_seen) return h('span', { class: 'muted' }, '—');
  const ratio = budget ? Math.min(1, c.checks_per_cycle / budget) : 0;
  const figures = `${c.checks_per_cycle} of ${budget} checks per cycle, ${c.cycle_seconds.toFixed(1)} s cycle`;
  const warning = `over budget: ${c.checks_per_cycle} checks per cycle exceed ${budget}`;
  if (!c.connected) {
    return [lastSeen(c, figures), c.over_budget
      ? h('div', { class: 'over-budget-warning stale', 'data-stale': 'true' }, 'last seen ', when(c.last_seen), `: ${warning}`) : ''];
  }
  return [figures, bar(ratio, c.over_budget),
    c.over_budget ? h('div', { class: 'over-budget-warning', role: 'alert' }, `⚠ ${warning}`) : ''];
}

// A connector's check load over the last day against the budget.
function loadChart(s, budget) {
  if (!s) return h('span', { class: 'muted' }, '—');
  return lineChart(s, s.checks_per_cycle, { label: `${s.connector} checks per cycle`, unit: '', line: budget });
}

// A byte count for people: 1.5 MB, 320 kB, 12 B.
function bytes(n) {
  if (!n) return '0 B';
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  const i = Math.min(units.length - 1, Math.floor(Math.log10(n) / 3));
  return `${(n / 10 ** (3 * i)).toFixed(i ? 1 : 0)} ${units[i]}`;
}

// A duration since a Unix ms time: "3 d 4 h", "5 h 2 min", "12 min".
function since(ms) {
  const m = Math.max(0, Math.floor((Date.now() - ms) / 60000));
  if (m >= 1440) return `${Math.floor(m / 1440)} d ${Math.floor((m % 1440) / 60)} h`;
  if (m >= 60) return `${Math.floor(m / 60)} h ${m % 60} min`;
  return `${m} min`;
}

// A connector's version: from its Hello, else its status (both shown to
// administrators only).
function versionOf(c) {
  return c.version || (c.status && c.status.version) || '';
}

// Per group, its connectors' versions with their counts, most common first.
function groupVersions(list) {
  const by = new Map();
  for (const c of list) {
    const v = versionOf(c);
    if (!v) continue;
    if (!by.has(c.group)) by.set(c.group, new Map());
    const counts = by.get(c.group);
    counts.set(v, (counts.get(v) || 0) + 1);
  }
  const out = new Map();
  for (const [g, counts] of by) {
    out.set(g, [...counts].sort((a, b) => (b[1] - a[1]) || b[0].localeCompare(a[0], undefined, { numeric: true })));
  }
  return out;
}

// The version cell: the version, marked when its group runs more than one
// (the group's versions on hover) and it is not the group's most common.
function versionCell(c, versions) {
  const v = versionOf(c);
  if (!v) return h('span', { class: 'muted', title: 'shown to administrators' }, '—');
  const group = versions.get(c.group) || [];
  if (group.length < 2) return h('span', { 'data-version': v }, v);
  const listed = group.map(([x, n]) => `${x} ×${n}`).join(', ');
  const odd = group[0][0] !== v;
  return h('span', { class: odd ? 'version-skew' : 'version-mixed', 'data-version': v, 'data-skew': String(odd),
    title: `group ${c.group} runs ${listed}` }, odd ? `⚠ ${v}` : v,
  h('div', { class: 'muted' }, `group: ${listed}`));
}

// A connector's host and process, from its latest heartbeat (null from a
// connector that sends none, and for callers who are not administrators).
function hostCell(c) {
  const s = c.status;
  if (!s) return h('span', { class: 'muted' }, '—');
  const mem = s.host_memory_total_bytes
    ? `${bytes(s.host_memory_total_bytes - s.host_memory_available_bytes)} of ${bytes(s.host_memory_total_bytes)}` : '—';
  const text = [
    `${s.os || '?'}/${s.arch || '?'}, ${s.applications} applications`,
    h('div', {}, `process: up ${s.process_started_at ? since(s.process_started_at) : '—'}, CPU ${s.process_cpu_percent.toFixed(1)} %, ${bytes(s.process_memory_bytes)}`),
    h('div', {}, `host: up ${s.host_booted_at ? since(s.host_booted_at) : '—'}, CPU ${s.host_cpu_percent.toFixed(1)} %, memory ${mem}`),
    h('div', { class: 'muted' }, `route ${s.default_route_interface || '—'}, DNS ${s.dns_resolvers.join(' ') || '—'}, ↑ ${bytes(s.bytes_sent)} ↓ ${bytes(s.bytes_received)}`),
  ];
  return h('div', { class: 'host', 'data-applications': s.applications }, lastSeen(c, ''), text);
}

// The log receivers this replica streams to (administrators only: the
// section stays hidden for others).
async function loadReceivers() {
  const section = document.getElementById('log-receivers-section');
  let body;
  try {
    body = await getJSON('/api/v1/log_receivers');
  } catch (e) {
    section.hidden = true;
    return;
  }
  const list = body.log_receivers || [];
  section.hidden = list.length === 0;
  document.querySelector('#log-receivers tbody').replaceChildren(...list.map((r) =>
    h('tr', { 'data-receiver': r.name, 'data-connected': String(r.connected) },
      h('td', {}, r.name),
      h('td', {}, r.destination),
      h('td', {}, r.format),
      h('td', { class: r.connected ? 'up' : 'down' }, r.connected ? 'yes' : 'no'),
      h('td', {}, `${r.spool_records}, ${r.spool_bytes} B`),
      h('td', {}, String(r.sent_total)),
      h('td', { class: r.dropped_total ? 'down' : '' }, String(r.dropped_total)),
      h('td', {}, r.last_error ? `${r.last_error} (${when(r.last_error_unix_ms)})` : h('span', { class: 'muted' }, '—')))));
}

function connectorsPage() {
  const q = new URLSearchParams(location.search);
  // Each connector's load series (GET /api/v1/load), read once a minute.
  let series = { check_budget: 0, connectors: [] };
  const drawSeries = () => {
    const by = new Map(series.connectors.map((s) => [s.connector, s]));
    for (const td of document.querySelectorAll('#connectors td.load-chart')) {
      td.replaceChildren(loadChart(by.get(td.dataset.connector), series.check_budget));
    }
  };
  const loadSeries = async () => {
    try {
      series = await getJSON('/api/v1/load');
      drawSeries();
    } catch (e) {
      for (const td of document.querySelectorAll('#connectors td.load-chart')) {
        td.replaceChildren(h('span', { class: 'error' }, `Cannot load: ${e.message}`));
      }
    }
  };
  const load = async () => {
    const tbody = document.querySelector('#connectors tbody');
    try {
      const body = await getJSON('/api/v1/connectors');
      const budget = body.check_budget;
      let list = body.connectors;
      const total = list.length;
      // Over budget now: a disconnected connector's load is as of when it
      // was last seen.
      const over = list.filter((c) => c.connected && c.over_budget).length;
      const connected = list.filter((c) => c.connected).length;
      const drainedCount = list.filter((c) => c.drained).length;
      const versions = groupVersions(list);
      const skewed = [...versions].filter(([, vs]) => vs.length > 1);
      document.getElementById('connector-overview').replaceChildren(h('div', { class: 'card' },
        skewed.length ? h('p', { class: 'version-skew', role: 'status', 'data-skewed-groups': skewed.map(([g]) => g).join(' ') },
          '⚠ versions differ within ', skewed.map(([g, vs]) => `${g} (${vs.map(([x, n]) => `${x} ×${n}`).join(', ')})`).join('; ')) : '',
        h('div', { class: 'counts' },
          countLink('All', 'unknown', total, '/connectors'),
          countLink('Connected', 'up', connected, '/connectors?state=connected'),
          countLink('Disconnected', 'down', total - connected, '/connectors?state=disconnected'),
          countLink('Over budget', 'unhealthy', over, '/connectors?over_budget=1'),
          countLink('Drained', 'unknown', drainedCount, '/connectors?state=drained'))));
      if (q.get('state') === 'connected') list = list.filter((c) => c.connected);
      if (q.get('state') === 'drained') list = list.filter((c) => c.drained);
      if (q.get('state') === 'disconnected') list = list.filter((c) => !c.connected);
      if (q.get('over_budget')) list = list.filter((c) => c.connected && c.over_budget);
      // Over budget now first: they need attention.
      const now_over = (c) => Number(c.connected && c.over_budget);
      list.sort((x, y) => (now_over(y) - now_over(x)) || x.name.localeCompare(y.name, undefined, { numeric: true }));
      const now = Date.now();
      tbody.replaceChildren(...list.map((c) => {
        const expires = c.certificate_not_after;
        const soon = expires && expires - now < 14 * 86400000;
        return h('tr', { class: c.connected && c.over_budget ? 'connector over-budget' : 'connector', 'data-connector': c.name,
          'data-connected': String(c.connected), 'data-over-budget': String(c.over_budget), 'data-drained': String(Boolean(c.drained)) },
        h('td', {}, c.name, c.disabled ? h('span', { class: 'muted' }, ' (disabled)') : '', drained(c)),
        h('td', {}, c.group),
        h('td', {}, session(c)),
        h('td', {}, versionCell(c, versions)),
        h('td', {}, checkLoad(c, budget)),
        h('td', { class: 'load-chart', 'data-connector': c.name }),
        h('td', {}, c.load ? lastSeen(c, `${c.load.checks_per_second.toFixed(1)} of ${c.load.rate_limit} checks/s, queue ${c.load.queue_depth}`) : h('span', { class: 'muted' }, '—')),
        h('td', { class: soon ? 'expiring' : '' }, expires ? when(expires) : h('span', { class: 'muted' }, '—')),
        h('td', {}, hostCell(c)));
      }));
      if (!list.length) tbody.append(h('tr', {}, h('td', { colSpan: 9, class: 'muted' }, 'No connector.')));
      drawSeries();
    } catch (e) {
      tbody.replaceChildren(h('tr', {}, h('td', { colSpan: 9, class: 'error' }, `Cannot load: ${e.message}`)));
    }
  };
  load();
  loadReceivers();
  setInterval(loadReceivers, 10000);
  loadSeries();
  setInterval(loadSeries, 60000);
  // Sessions show in transitions (a disconnect turns its applications
  // Unknown): re-read on those, once per 2 s at most; load figures change
  // without transitions, so every 10 s too.
  const refresh = coalesce(load, 2000);
  live({ onOpen: refresh, onTransition: (t) => { if (t.cause === 'disconnected' || t.from === 'unknown') refresh(); } });
  setInterval(load, 10000);
}

document.addEventListener('DOMContentLoaded', async () => {
  await whoami();
  const page = document.body.dataset.page;
  if (page === 'list') listPage();
  else if (page === 'app') appPage();
  else if (page === 'connectors') connectorsPage();
});
