// Small DOM helpers: elements are built, never parsed from strings (names and keys are data).

/** `h('button', {class: 'x', onclick: f}, 'text', child)`. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

/** Timers of the page on screen, stopped when another page is shown. */
const timers = new Set();

/** Runs `fn` now and every `ms` while the page is shown (skipped while the tab is hidden). */
export function every(ms, fn) {
  let busy = false;
  const tick = async () => {
    if (busy || document.hidden) return;
    busy = true;
    try { await fn(); } finally { busy = false; }
  };
  tick();
  const id = setInterval(tick, ms);
  timers.add(id);
  return id;
}

export function stopTimers() {
  for (const id of timers) clearInterval(id);
  timers.clear();
}

let toastTimer;
/** A short status message, read out by screen readers. */
export function toast(text, kind = 'ok') {
  const el = document.getElementById('toast');
  el.textContent = text;
  el.className = `toast show ${kind}`;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { el.className = 'toast'; }, 4000);
}

/** Asks in a modal dialog; resolves true when confirmed. */
export function confirmDialog(title, text, action) {
  return new Promise((resolve) => {
    const yes = h('button', { type: 'submit', class: 'danger', value: 'yes' }, action);
    const no = h('button', { type: 'button', class: 'secondary', onclick: () => dialog.close('no') }, 'Cancel');
    const dialog = h('dialog', { 'aria-labelledby': 'dialog-title' },
      h('form', { method: 'dialog' },
        h('h2', { id: 'dialog-title' }, title),
        h('p', {}, text),
        h('div', { class: 'actions' }, no, yes)));
    dialog.addEventListener('close', () => { dialog.remove(); resolve(dialog.returnValue === 'yes'); });
    document.body.append(dialog);
    dialog.showModal();
    no.focus();
  });
}

/** "3 s", "2 min 5 s", "1 h 4 min". */
export function duration(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function time(ms) {
  return new Date(ms).toLocaleString();
}

/** A table in a horizontally scrolling wrapper (narrow screens). */
export function table(caption, head, rows, attrs = {}) {
  return h('div', { class: 'table-wrap' },
    h('table', attrs,
      caption ? h('caption', {}, caption) : null,
      h('thead', {}, h('tr', {}, head.map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, rows)));
}
