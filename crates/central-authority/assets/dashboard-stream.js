// reach Health dashboard: the change stream shared by every dashboard tab of
// one browser (a SharedWorker, served by the CA at /assets/dashboard-stream.js).
//
// Over HTTP/1.1 (a CA behind an HTTP/1.1 proxy, or with `[tls] enabled =
// false`) a browser opens at most 6 connections to one host, and each open
// server-sent event stream holds one for good: with 6 dashboard tabs open, a
// 7th never loads and no tab's API call gets through. So over HTTP/1.1 the
// tabs do not open a stream each; this worker opens one (one-time ticket,
// then `GET /api/v1/health/stream`) and relays it to every tab:
//   tab → worker: {type: 'join', token} (the tab's API token, may be empty),
//                 {type: 'leave'} (the tab is going away);
//   worker → tab: {type: 'state', state, text} (the live indicator),
//                 {type: 'open', version, epoch} (the stream opened, or
//                 this tab joined it: every transition after `version`
//                 reaches the tab; `epoch` names the CA process `version`
//                 counts in; version null: re-read, something may have
//                 been missed),
//                 {type: 'transition', transition}.
// Over HTTP/2 every tab keeps its own stream (multiplexed on one connection).
'use strict';

const ports = new Set();
let token = '';
// A signed-in person's CSRF token (their session is a cookie).
let csrf = '';
let started = false;
let retry = 1000;
// The indicator's last state, sent to a tab that joins.
let state = { type: 'state', state: 'connecting', text: 'connecting…' };
// The stream is open (a tab that joins gets `open` at once).
let isOpen = false;
// The newest version the stream has delivered: the hello's, then each
// transition's number (its event id).
let version = null;
// The epoch of the CA process that stream comes from (its hello's).
let epoch = null;

function send(m) {
  for (const p of ports) p.postMessage(m);
}

function setState(s, text) {
  state = { type: 'state', state: s, text };
  send(state);
}

function again() {
  isOpen = false;
  setState('reconnecting', 'reconnecting…');
  setTimeout(open, retry);
  retry = Math.min(retry * 2, 30000);
}

async function open() {
  let ticket;
  try {
    const headers = { Accept: 'application/json', 'Content-Type': 'application/json' };
    if (token) headers.Authorization = `Bearer ${token}`;
    else if (csrf) headers['X-CSRF-Token'] = csrf;
    const r = await fetch('/api/v1/health/stream/ticket', {
      method: 'POST', credentials: 'same-origin', headers, body: '{}',
    });
    if (r.status === 401) {
      // Reopened when a tab joins with a token.
      started = false;
      setState('offline', 'not live: no token');
      return;
    }
    if (!r.ok) throw new Error(String(r.status));
    ticket = (await r.json()).ticket;
  } catch (_) {
    again();
    return;
  }
  const source = new EventSource(`/api/v1/health/stream?${new URLSearchParams({ ticket })}`);
  source.addEventListener('hello', (ev) => {
    retry = 1000;
    let v = null;
    let e = null;
    try { ({ version: v, epoch: e } = JSON.parse(ev.data)); } catch (_) { /* ignored */ }
    version = v === undefined ? null : v;
    epoch = e || null;
    isOpen = true;
    setState('live', 'live');
    send({ type: 'open', version, epoch });
  });
  source.addEventListener('transition', (ev) => {
    let t = null;
    try { t = JSON.parse(ev.data); } catch (_) { /* ignored */ }
    if (!t) return;
    const seq = Number(ev.lastEventId);
    if (ev.lastEventId && Number.isFinite(seq) && (version === null || seq > version)) version = seq;
    send({ type: 'transition', transition: t });
  });
  source.addEventListener('lagged', () => send({ type: 'open', version: null, epoch }));
  source.addEventListener('error', () => {
    // The ticket was used: reopen with a new one rather than let the
    // browser retry the same URL.
    source.close();
    again();
  });
}

self.addEventListener('connect', (ev) => {
  const port = ev.ports[0];
  port.addEventListener('message', (m) => {
    const d = m.data || {};
    if (d.type === 'join') {
      if (d.token) token = d.token;
      if (d.csrf) csrf = d.csrf;
      ports.add(port);
      port.postMessage(state);
      if (isOpen) port.postMessage({ type: 'open', version, epoch });
      if (!started) {
        started = true;
        open();
      }
    } else if (d.type === 'leave') {
      ports.delete(port);
    }
  });
  port.start();
});
