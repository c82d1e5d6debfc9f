// The console's shell: sign-in, navigation by the token's role, and the hash router.

import { api, ApiError, session } from './api.js';
import { h, stopTimers } from './dom.js';
import * as pages from './pages.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');

/** The signed-in token (`name`, `role`, `apps`), what the page offers follows it. */
export const me = { token: null };

const ROLES = ['viewer', 'editor', 'admin'];
export const atLeast = (role) => me.token && ROLES.indexOf(me.token.role) >= ROLES.indexOf(role);

/** Whether the token may change an item of `apps` (as the API decides: all its apps held). */
export function mayChange(apps) {
  if (!atLeast('editor')) return false;
  const mine = me.token.apps;
  if (!mine) return true;
  return apps.length > 0 && apps.every((a) => mine.includes(a));
}

const NAV = [
  ['#/policies', 'Policies', 'viewer'],
  ['#/consumers', 'Consumers', 'viewer'],
  ['#/tokens', 'Tokens', 'admin'],
  ['#/audit', 'Audit log', 'viewer'],
  ['#/health', 'Health', 'viewer'],
];

function renderShell() {
  if (!me.token) {
    nav.hidden = true;
    who.replaceChildren();
    return;
  }
  nav.hidden = false;
  nav.replaceChildren(h('ul', {}, NAV.filter(([, , role]) => atLeast(role)).map(([href, label]) =>
    h('li', {}, h('a', { href, 'data-nav': label }, label)))));
  who.replaceChildren(
    h('span', { class: 'badge', title: 'Signed-in token' }, `${me.token.name} · ${me.token.role}`,
      me.token.apps ? ` · apps: ${me.token.apps.join(', ')}` : ''),
    h('button', { type: 'button', class: 'secondary small', onclick: signOut }, 'Sign out'));
}

function signOut() {
  session.token = null;
  me.token = null;
  renderShell();
  location.hash = '#/signin';
  route();
}

function signInPage(message) {
  const input = h('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true, 'aria-describedby': 'token-help token-error', spellcheck: 'false' });
  const error = h('p', { id: 'token-error', class: 'error', role: 'alert' }, message || '');
  const form = h('form', { class: 'card narrow', 'aria-labelledby': 'signin-title' },
    h('h1', { id: 'signin-title' }, 'Sign in'),
    h('label', { for: 'token' }, 'API token'),
    input,
    h('p', { id: 'token-help', class: 'muted' },
      'A management token (tg_…). The first one comes from ', h('code', {}, 'tollgate token create --role admin --name you'),
      ' on the server\'s machine. It is kept in this tab only (sessionStorage).'),
    error,
    h('div', { class: 'actions' }, h('button', { type: 'submit' }, 'Sign in')));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    error.textContent = '';
    session.token = input.value.trim();
    try {
      await loadMe();
      location.hash = '#/policies';
      route();
    } catch (err) {
      session.token = null;
      error.textContent = err.status === 401 ? 'Unknown token: check it and try again.' : err.message;
      input.setAttribute('aria-invalid', 'true');
      input.focus();
    }
  });
  main.replaceChildren(form);
  input.focus();
}

async function loadMe() {
  const { data } = await api('GET', '/v1/admin/me');
  me.token = data;
  renderShell();
}

const ROUTES = [
  [/^#\/policies$/, pages.policies],
  [/^#\/policies\/new$/, (ctx) => pages.policyForm(ctx, null)],
  [/^#\/policies\/([^/]+)\/edit$/, (ctx, name) => pages.policyForm(ctx, decodeURIComponent(name))],
  [/^#\/policies\/([^/]+)$/, (ctx, name) => pages.policy(ctx, decodeURIComponent(name))],
  [/^#\/consumers(?:\/([^/]+))?$/, (ctx, id) => pages.consumers(ctx, id ? decodeURIComponent(id) : '')],
  [/^#\/tokens$/, pages.tokens],
  [/^#\/audit$/, pages.audit],
  [/^#\/health$/, pages.health],
];

async function route() {
  stopTimers();
  const hash = location.hash || '#/policies';
  if (!me.token) {
    if (session.token) {
      try { await loadMe(); } catch (e) {
        session.token = null;
        return signInPage(e.status === 401 ? 'That token is no longer valid: sign in again.' : e.message);
      }
    } else {
      return signInPage();
    }
  }
  if (hash === '#/signin') { location.hash = '#/policies'; return; }
  for (const a of nav.querySelectorAll('a')) {
    if (hash.startsWith(a.getAttribute('href'))) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const found = ROUTES.map(([re, page]) => [hash.match(re), page]).find(([m]) => m);
  const view = h('div', { class: 'page' });
  main.replaceChildren(view);
  const ctx = { view, me: me.token, atLeast, mayChange, go: (to) => { location.hash = to; } };
  if (!found) {
    view.append(h('h1', {}, 'Not found'), h('p', {}, h('a', { href: '#/policies' }, 'Back to policies')));
    return;
  }
  try {
    await found[1](ctx, ...found[0].slice(1));
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return signOut();
    view.append(h('p', { class: 'error', role: 'alert' }, e.message));
  }
  const heading = view.querySelector('h1');
  document.title = heading ? `${heading.textContent} · Tollgate` : 'Tollgate console';
}

window.addEventListener('hashchange', () => { route(); main.focus({ preventScroll: true }); });
route();
