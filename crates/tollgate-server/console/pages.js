// The console's pages. Each takes `ctx` (`view`, `me`, `atLeast`, `mayChange`, `go`).

import { all, api, ApiError, enc } from './api.js';
import { drawChart } from './chart.js';
import { confirmDialog, duration, every, h, table, time, toast } from './dom.js';
import { ALGORITHMS, PARAMS, describeRule } from './rules.js';

const PERIODS = ['per_second', 'per_minute', 'per_hour', 'per_day', 'per_week', 'per_month'];

function linkButton(href, text, cls = '') {
  return h('a', { href, class: `button ${cls}`.trim() }, text);
}

function header(title, ...actions) {
  return h('div', { class: 'page-head' }, h('h1', {}, title), h('div', { class: 'actions' }, actions));
}

async function deletePolicy(policy) {
  const ok = await confirmDialog(`Delete policy ${policy.name}?`,
    'Checks naming it are refused with 404 from now on. The audit log keeps what it was.',
    `Delete ${policy.name}`);
  if (!ok) return false;
  try {
    await api('DELETE', `/v1/admin/policies/${enc(policy.name)}`, undefined, { headers: { 'if-match': `"${policy.version}"` } });
    toast(`Policy ${policy.name} deleted`);
    return true;
  } catch (e) {
    toast(e.message, 'bad');
    return false;
  }
}

function editable(ctx, p) {
  return p.source === 'database' && ctx.mayChange(p.apps || []);
}

// ---------------------------------------------------------------- policies

export async function policies(ctx) {
  const { view } = ctx;
  view.append(header('Policies', ctx.atLeast('editor') ? linkButton('#/policies/new', 'New policy') : null));
  const search = h('input', { id: 'search', type: 'search', placeholder: 'name, description, app or algorithm' });
  view.append(h('div', { class: 'field inline' }, h('label', { for: 'search' }, 'Search'), search));
  const host = h('div', { 'aria-live': 'polite' });
  view.append(host);
  let items = [];
  const render = () => {
    const q = search.value.trim().toLowerCase();
    const shown = items.filter((p) => !q || [p.name, p.description || '', ...(p.apps || []), ...p.rules.map((r) => r.algorithm)]
      .some((s) => s.toLowerCase().includes(q)));
    if (!shown.length) {
      host.replaceChildren(h('p', { class: 'muted' }, items.length ? 'No policy matches.' : 'No policies yet.'));
      return;
    }
    host.replaceChildren(table(`${shown.length} of ${items.length} policies`, ['Name', 'Rules', 'Mode', 'Apps', 'Source', ''],
      shown.map((p) => h('tr', { 'data-policy': p.name },
        h('td', {}, h('a', { href: `#/policies/${enc(p.name)}` }, p.name), p.enabled === false ? h('span', { class: 'tag' }, 'disabled') : null,
          p.description ? h('div', { class: 'muted small' }, p.description) : null),
        h('td', {}, p.rules.map((r) => h('div', {}, h('span', { class: 'algo' }, r.algorithm), ' ', describeRule(r)))),
        h('td', {}, p.mode || 'enforce', p.on_limit === 'delay' ? ' · delay' : ''),
        h('td', {}, (p.apps || []).join(', ') || h('span', { class: 'muted' }, 'global')),
        h('td', {}, p.source === 'file' ? 'file (read-only)' : `database v${p.version}`),
        h('td', { class: 'row-actions' }, editable(ctx, p) ? [
          linkButton(`#/policies/${enc(p.name)}/edit`, 'Edit', 'secondary small'),
          h('button', { type: 'button', class: 'danger small', 'data-action': 'delete', 'aria-label': `Delete ${p.name}`, onclick: async () => {
            if (await deletePolicy(p)) { items = items.filter((x) => x.name !== p.name); render(); }
          } }, 'Delete'),
        ] : null)))));
  };
  search.addEventListener('input', render);
  items = await all('/v1/admin/policies');
  render();
}

// ---------------------------------------------------------------- one policy, live

export async function policy(ctx, name) {
  const { view } = ctx;
  const { data: p } = await api('GET', `/v1/admin/policies/${enc(name)}`);
  view.append(header(`Policy ${p.name}`,
    editable(ctx, p) ? [
      linkButton(`#/policies/${enc(p.name)}/edit`, 'Edit', 'secondary'),
      h('button', { type: 'button', class: 'danger', 'data-action': 'delete', onclick: async () => { if (await deletePolicy(p)) ctx.go('#/policies'); } }, 'Delete'),
    ] : null));
  view.append(h('p', { class: 'muted' }, p.description || '',
    p.source === 'file' ? ' From the configuration file (read-only).' : ` Version ${p.version}, last changed by ${p.updated_by} on ${time(p.updated_at)}.`));
  view.append(h('dl', { class: 'facts' },
    h('dt', {}, 'Mode'), h('dd', {}, p.mode || 'enforce'),
    h('dt', {}, 'When over the limit'), h('dd', {}, p.on_limit === 'delay' ? `delay (up to ${p.max_wait || '—'})` : 'reject (429)'),
    h('dt', {}, 'Apps'), h('dd', {}, (p.apps || []).join(', ') || 'global'),
    h('dt', {}, 'Enabled'), h('dd', {}, p.enabled === false ? 'no' : 'yes')));
  view.append(table('Rules: a request is admitted only if every rule admits it', ['Rule', 'Algorithm', 'Parameters', 'What it does'],
    p.rules.map((r, i) => h('tr', {},
      h('td', {}, r.name || `${r.algorithm}.${i}`),
      h('td', {}, ALGORITHMS[r.algorithm]?.label || r.algorithm),
      h('td', {}, describeRule(r)),
      h('td', { class: 'small' }, ALGORITHMS[r.algorithm]?.about || '')))));
  liveSections(ctx, p.name);
}

function liveSections(ctx, name) {
  const { view } = ctx;
  const chart = h('div', { id: 'live-chart', class: 'chart-host' });
  const summary = h('p', { id: 'live-summary', class: 'muted' }, 'Waiting for data…');
  const nearest = h('div', { id: 'nearest' });
  let seconds = 900;
  let last = null;
  const rangeButtons = [[900, 'Last 15 minutes'], [120, 'Last 2 minutes']].map(([s, label]) => {
    const b = h('button', { type: 'button', class: 'secondary small', 'aria-pressed': String(s === seconds), onclick: () => {
      seconds = s;
      for (const other of rangeButtons) other.setAttribute('aria-pressed', String(other === b));
      if (last) drawChart(chart, last, seconds);
    } }, label);
    return b;
  });
  view.append(h('section', { 'aria-labelledby': 'live-title' },
    h('h2', { id: 'live-title' }, 'Checks per second'),
    h('div', { class: 'legend' }, h('span', { class: 'swatch allowed' }), 'allowed ', h('span', { class: 'swatch denied' }), 'denied',
      h('span', { class: 'muted' }, ' · this instance, updated every second'),
      h('span', { class: 'range', role: 'group', 'aria-label': 'Time range' }, rangeButtons)),
    chart, summary));
  view.append(h('section', { 'aria-labelledby': 'nearest-title' }, h('h2', { id: 'nearest-title' }, 'Keys nearest their limits'), nearest));
  let shown = [];
  let fetchedAt = 0;
  const drawNearest = () => {
    if (!shown.length) { nearest.replaceChildren(h('p', { class: 'muted' }, 'No key is being limited right now.')); return; }
    const age = Date.now() - fetchedAt;
    nearest.replaceChildren(table(null, ['Key', 'Rule', 'Remaining', 'Full again in'], shown.map((n) => h('tr', {},
      h('td', {}, h('code', {}, n.key)), h('td', {}, n.rule),
      h('td', {}, meter(n.remaining, n.limit)),
      h('td', {}, duration(n.reset_in_ms - age))))));
  };
  every(1000, async () => {
    try {
      const { data } = await api('GET', `/v1/admin/live/policies/${enc(name)}`);
      last = data;
      const t = drawChart(chart, data, seconds);
      summary.textContent = `Last minute: ${t.minuteAllowed} allowed, ${t.minuteDenied} denied. Last 15 minutes: ${t.allowed} allowed, ${t.denied} denied.`;
      shown = data.nearest;
      fetchedAt = Date.now();
      drawNearest();
    } catch (e) {
      summary.textContent = `Live data unavailable: ${e.message}`;
    }
  });
  keyLookup(ctx, name);
}

function meter(remaining, limit) {
  const used = limit > 0 ? 1 - remaining / limit : 0;
  return h('span', { class: 'meter-wrap' },
    h('meter', { min: 0, max: limit, value: limit - remaining, low: limit * 0.5, high: limit * 0.8, optimum: 0, 'aria-label': `${remaining} of ${limit} left` }),
    ` ${remaining} / ${limit}`, used >= 1 ? h('span', { class: 'tag bad' }, 'at limit') : null);
}

function usedMeter(used, limit) {
  return h('meter', { min: 0, max: limit, value: Math.min(used, limit), low: limit * 0.5, high: limit * 0.8, optimum: 0, 'aria-label': `${used} of ${limit} used` });
}

function keyLookup(ctx, name) {
  const input = h('input', { id: 'lookup-key', name: 'key', required: true, autocomplete: 'off' });
  const out = h('div', { id: 'lookup-result', 'aria-live': 'polite' });
  const form = h('form', { class: 'inline-form' },
    h('label', { for: 'lookup-key' }, 'Key'), input, h('button', { type: 'submit' }, 'Look up'));
  ctx.view.append(h('section', { 'aria-labelledby': 'lookup-title' },
    h('h2', { id: 'lookup-title' }, 'Look up a key'),
    h('p', { class: 'muted' }, 'Each rule\'s remaining units and time to reset, read without counting (a check with cost 0).'),
    form, out));
  let key = null;
  let result = null;
  let at = 0;
  const draw = () => {
    if (!result) return;
    const age = Date.now() - at;
    out.replaceChildren(h('p', {}, result.allowed ? `${key}: one more request would be admitted.` : `${key}: the next request would be refused.`),
      table(null, ['Rule', 'Remaining', 'Full again in'], result.rules.map((r) => h('tr', {},
        h('td', {}, r.name), h('td', {}, meter(r.remaining, r.limit)),
        h('td', { class: 'countdown' }, duration(Math.max(0, r.reset_after_ms - age)))))));
  };
  const peek = async () => {
    if (!key) return;
    try {
      const { data } = await api('POST', '/v1/check', { key, policy: name, cost: 0 }, { accept: [429], anonymous: true });
      result = data;
      at = Date.now();
      draw();
    } catch (e) {
      out.replaceChildren(h('p', { class: 'error', role: 'alert' }, e.message));
    }
  };
  form.addEventListener('submit', (e) => { e.preventDefault(); key = input.value; peek(); });
  every(2000, peek);
  every(250, draw);
}

// ---------------------------------------------------------------- policy form

function splitApps(text) {
  return text.split(',').map((s) => s.trim()).filter(Boolean);
}

function numberOrText(v) {
  return /^\d+$/.test(v) ? Number(v) : v;
}

export async function policyForm(ctx, name) {
  const { view } = ctx;
  let current = null;
  if (name) {
    current = (await api('GET', `/v1/admin/policies/${enc(name)}`)).data;
    if (current.source === 'file') {
      view.append(header(`Policy ${name}`), h('p', {}, 'This policy comes from the configuration file: edit the file (it reloads by itself).'));
      return;
    }
  }
  if (!ctx.atLeast('editor')) {
    view.append(header(name ? `Edit ${name}` : 'New policy'), h('p', { class: 'error' }, 'Your token is a viewer: it cannot change policies.'));
    return;
  }
  const p = current || { name: '', description: '', rules: [{ algorithm: 'fixed_window', limit: 10, period: '1s' }], mode: 'enforce', on_limit: 'reject', apps: ctx.me.apps ? [ctx.me.apps[0]] : [], enabled: true };
  let rules = p.rules.map((r) => ({ ...r }));
  const field = (id, label, input, help) => h('div', { class: 'field' },
    h('label', { for: id }, label), input,
    help ? h('p', { class: 'help', id: `${id}-help` }, help) : null,
    h('p', { class: 'field-error', id: `${id}-error` }));
  const inp = (id, fieldPath, value, extra = {}) => h('input', { id, name: id, value: value ?? '', 'data-field': fieldPath, 'aria-describedby': `${id}-help ${id}-error`, ...extra });
  const nameInput = inp('f-name', 'name', p.name, { required: true, readonly: !!current, pattern: '[A-Za-z0-9_.\\-]{1,64}' });
  const desc = inp('f-description', 'description', p.description);
  const mode = h('select', { id: 'f-mode', 'data-field': 'mode', 'aria-describedby': 'f-mode-help f-mode-error' },
    ['enforce', 'shadow'].map((m) => h('option', { value: m, selected: p.mode === m }, m)));
  const onLimit = h('select', { id: 'f-on_limit', 'data-field': 'on_limit', 'aria-describedby': 'f-on_limit-help f-on_limit-error' },
    ['reject', 'delay'].map((m) => h('option', { value: m, selected: p.on_limit === m }, m)));
  const maxWait = inp('f-max_wait', 'max_wait', p.max_wait);
  const apps = inp('f-apps', 'apps', (p.apps || []).join(', '));
  const enabled = h('input', { id: 'f-enabled', type: 'checkbox', 'data-field': 'enabled', checked: p.enabled !== false });
  const rulesHost = h('div', { id: 'rules' });
  const summary = h('div', { class: 'error-summary', role: 'alert', tabindex: '-1', hidden: true });

  const readRules = () => {
    rules = [...rulesHost.querySelectorAll('fieldset.rule')].map((fs) => {
      const r = {};
      for (const el of fs.querySelectorAll('[data-param]')) {
        const v = el.value.trim();
        if (v !== '') r[el.dataset.param] = el.dataset.kind === 'count' ? numberOrText(v) : v;
      }
      return r;
    });
  };
  const renderRules = () => {
    rulesHost.replaceChildren(...rules.map((r, i) => {
      const algo = ALGORITHMS[r.algorithm] ? r.algorithm : 'fixed_window';
      const id = (k) => `r${i}-${k}`;
      const select = h('select', { id: id('algorithm'), 'data-param': 'algorithm', 'data-field': `rules[${i}].algorithm`, 'aria-describedby': `${id('algorithm')}-help ${id('algorithm')}-error` },
        Object.entries(ALGORITHMS).map(([k, a]) => h('option', { value: k, selected: k === algo }, a.label)));
      select.addEventListener('change', () => { readRules(); renderRules(); rulesHost.querySelector(`#${id('algorithm')}`).focus(); });
      const params = ALGORITHMS[algo].params.map((k) => {
        const def = PARAMS[k];
        const attrs = { id: id(k), 'data-param': k, 'data-kind': def.kind, 'data-field': `rules[${i}].${k}`, 'aria-describedby': `${id(k)}-help ${id(k)}-error` };
        const input = def.kind === 'choice'
          ? h('select', attrs, def.choices.map((c) => h('option', { value: c, selected: (r[k] || 'clock') === c }, c)))
          : h('input', { ...attrs, value: r[k] ?? '', inputmode: def.kind === 'count' ? 'numeric' : 'text' });
        return field(id(k), def.label, input, def.help);
      });
      const remove = h('button', { type: 'button', class: 'secondary small', disabled: rules.length === 1, onclick: () => {
        readRules(); rules.splice(i, 1); renderRules();
      } }, `Remove rule ${i + 1}`);
      return h('fieldset', { class: 'rule', 'data-field': `rules[${i}]` },
        h('legend', {}, `Rule ${i + 1}`),
        field(id('algorithm'), 'Algorithm', select, ALGORITHMS[algo].about),
        h('div', { class: 'grid' }, params,
          field(id('name'), 'Rule name (optional)', h('input', { id: id('name'), 'data-param': 'name', 'data-field': `rules[${i}].name`, value: r.name ?? '', 'aria-describedby': `${id('name')}-help ${id('name')}-error` }), 'Shown in headers and answers.')),
        h('p', { class: 'field-error', id: `${id('rule')}-error`, 'data-error-for': `rules[${i}]` }),
        h('div', { class: 'actions' }, remove));
    }));
  };
  renderRules();
  const addRule = h('button', { type: 'button', class: 'secondary', onclick: () => {
    readRules(); rules.push({ algorithm: 'token_bucket', capacity: 10, refill: 1, per: '1s' }); renderRules();
    rulesHost.querySelector(`#r${rules.length - 1}-algorithm`).focus();
  } }, 'Add a rule');

  const form = h('form', { class: 'card', novalidate: true, 'aria-labelledby': 'form-title' },
    h('h1', { id: 'form-title' }, current ? `Edit policy ${name}` : 'New policy'),
    summary,
    h('div', { class: 'grid' },
      field('f-name', 'Name', nameInput, current ? 'A policy keeps its name.' : 'Letters, digits, _ - . (up to 64): what checks name.'),
      field('f-description', 'Description', desc, 'What it is for (optional).'),
      field('f-mode', 'Mode', mode, 'shadow counts and reports denials but never refuses: try a policy out first.'),
      field('f-on_limit', 'When over the limit', onLimit, 'reject answers 429; delay holds the request until it fits (up to max wait).'),
      field('f-max_wait', 'Max wait (delay only)', maxWait, 'Like 500ms; at most 60s.'),
      field('f-apps', 'Apps', apps, ctx.me.apps ? `Comma-separated; your token holds: ${ctx.me.apps.join(', ')}.` : 'Comma-separated; empty for a global policy.')),
    h('div', { class: 'field checkbox' }, enabled, h('label', { for: 'f-enabled' }, 'Enabled (a disabled policy is kept but not applied)'), h('p', { class: 'field-error', id: 'f-enabled-error' })),
    h('h2', {}, 'Rules'),
    h('p', { class: 'muted' }, 'A request is admitted only if every rule admits it, and a refused request counts in none.'),
    rulesHost, addRule,
    h('div', { class: 'actions end' },
      linkButton(current ? `#/policies/${enc(name)}` : '#/policies', 'Cancel', 'secondary'),
      h('button', { type: 'submit' }, current ? 'Save changes' : 'Create policy')));

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    readRules();
    for (const el of form.querySelectorAll('.field-error')) el.textContent = '';
    for (const el of form.querySelectorAll('[aria-invalid]')) el.removeAttribute('aria-invalid');
    summary.hidden = true;
    const body = { rules, mode: mode.value, on_limit: onLimit.value, apps: splitApps(apps.value), enabled: enabled.checked };
    if (desc.value.trim()) body.description = desc.value.trim();
    if (maxWait.value.trim()) body.max_wait = maxWait.value.trim();
    try {
      if (current) {
        await api('PUT', `/v1/admin/policies/${enc(name)}`, body, { headers: { 'if-match': `"${current.version}"` } });
        toast(`Policy ${name} saved`);
      } else {
        await api('POST', '/v1/admin/policies', { name: nameInput.value.trim(), ...body });
        toast(`Policy ${nameInput.value.trim()} created`);
      }
      ctx.go(`#/policies/${enc(current ? name : nameInput.value.trim())}`);
    } catch (err) {
      showProblem(form, summary, err);
    }
  });
  view.append(form);
}

/** Puts a problem+json answer next to the field it names (or the nearest enclosing one). */
function showProblem(form, summary, err) {
  const problem = err instanceof ApiError ? err.problem : { detail: err.message };
  let target = null;
  let path = problem.field || '';
  while (path && !target) {
    target = form.querySelector(`[data-field="${CSS.escape(path)}"]`);
    if (!target) path = path.replace(/(\.[^.[\]]+|\[\d+\])$/, '') === path ? '' : path.replace(/(\.[^.[\]]+|\[\d+\])$/, '');
  }
  let message = problem.detail || 'The server refused the change.';
  if (err.status === 412) message = 'Someone changed this policy since you opened it: reload the page, then apply your change again.';
  if (target) {
    const errorEl = target.tagName === 'FIELDSET'
      ? target.querySelector(':scope > .field-error')
      : document.getElementById(`${target.id}-error`);
    if (errorEl) errorEl.textContent = message;
    target.setAttribute('aria-invalid', 'true');
  }
  summary.replaceChildren(h('p', {}, target ? `Check ${problem.field}: ${message}` : message));
  summary.hidden = false;
  (target && target.tagName !== 'FIELDSET' ? target : summary).focus();
}

// ---------------------------------------------------------------- consumers

export async function consumers(ctx, id) {
  const { view } = ctx;
  view.append(header('Consumers'));
  const input = h('input', { id: 'consumer-id', value: id, required: true, autocomplete: 'off' });
  const form = h('form', { class: 'inline-form' }, h('label', { for: 'consumer-id' }, 'Consumer id'), input, h('button', { type: 'submit' }, 'Show'));
  form.addEventListener('submit', (e) => { e.preventDefault(); if (input.value.trim()) ctx.go(`#/consumers/${enc(input.value.trim())}`); });
  view.append(h('p', { class: 'muted' }, 'A consumer\'s limits over six periods, checked with {"consumer": "<id>"} on /v1/check.'), form);
  if (!id) { input.focus(); return; }

  const live = h('div', { id: 'call-limits' });
  view.append(h('section', { 'aria-labelledby': 'usage-title' }, h('h2', { id: 'usage-title' }, `Live usage of ${id}`), live));
  let usage = null;
  let at = 0;
  const draw = () => {
    if (!usage) return;
    const age = Date.now() - at;
    live.replaceChildren(table(usage.degraded ? 'Read from the local fallback (backend unavailable)' : null, ['Period', 'Limit', 'Calls made', 'Resets in'],
      PERIODS.map((p) => {
        const limit = usage.limits[p];
        const s = usage.current_state[p];
        return h('tr', {}, h('td', {}, p.replace('per_', '')), h('td', {}, limit < 0 ? 'unlimited' : limit),
          h('td', {}, limit < 0 ? '—' : [usedMeter(s.calls_made, limit), ` ${s.calls_made} of ${limit} made`]),
          h('td', { class: 'countdown' }, s.reset_in_seconds < 0 ? '—' : duration(s.reset_in_seconds * 1000 - age)));
      })));
  };
  every(1000, async () => {
    try {
      usage = (await api('GET', `/v1/consumers/${enc(id)}/call-limits`)).data;
      at = Date.now();
      draw();
    } catch (e) { live.replaceChildren(h('p', { class: 'error' }, e.message)); }
  });
  every(250, draw);

  const records = h('div', { id: 'records' });
  view.append(h('section', { 'aria-labelledby': 'records-title' }, h('h2', { id: 'records-title' }, 'Limit records'),
    h('p', { class: 'muted' }, 'Records active now are summed per period; -1 is unlimited.'), records));
  const canChange = ctx.atLeast('editor') && !ctx.me.apps;
  const load = async () => {
    const { data } = await api('GET', `/v1/admin/consumers/${enc(id)}/limits`);
    if (!data.items.length) { records.replaceChildren(h('p', { class: 'muted' }, 'No records: the server\'s [consumers] defaults apply.')); return; }
    records.replaceChildren(table(null, ['Scope', 'Active', ...PERIODS.map((p) => p.replace('per_', '')), ''], data.items.map((r) => h('tr', {},
      h('td', {}, r.scope || 'all'), h('td', { class: 'small' }, `${r.from || 'always'} → ${r.to || 'never'}`),
      PERIODS.map((p) => h('td', {}, r.limits?.[p] ?? r[p] ?? '')),
      h('td', {}, canChange ? h('button', { type: 'button', class: 'danger small', 'data-action': 'delete', onclick: async () => {
        if (!await confirmDialog('Delete this limit record?', `The consumer ${id} loses this record's limits at once.`, 'Delete record')) return;
        try {
          await api('DELETE', `/v1/admin/consumers/${enc(id)}/limits/${enc(r.id)}`, undefined, { headers: { 'if-match': `"${r.version}"` } });
          toast('Record deleted'); load();
        } catch (e) { toast(e.message, 'bad'); }
      } }, 'Delete') : null)))));
  };
  await load();
  if (canChange) {
    const inputs = PERIODS.map((p) => h('input', { id: `c-${p}`, 'data-field': p, value: '-1', inputmode: 'numeric', 'aria-describedby': `c-${p}-error` }));
    const scope = h('input', { id: 'c-scope', 'data-field': 'scope', 'aria-describedby': 'c-scope-error' });
    const summary = h('div', { class: 'error-summary', role: 'alert', tabindex: '-1', hidden: true });
    const add = h('form', { class: 'card', novalidate: true },
      h('h2', {}, 'Add a limit record'), summary,
      h('div', { class: 'grid six' }, PERIODS.map((p, i) => h('div', { class: 'field' }, h('label', { for: `c-${p}` }, p.replace('per_', 'Per ')), inputs[i], h('p', { class: 'field-error', id: `c-${p}-error` })))),
      h('div', { class: 'field' }, h('label', { for: 'c-scope' }, 'Scope (optional: a path prefix)'), scope, h('p', { class: 'field-error', id: 'c-scope-error' })),
      h('div', { class: 'actions end' }, h('button', { type: 'submit' }, 'Add record')));
    add.addEventListener('submit', async (e) => {
      e.preventDefault();
      for (const el of add.querySelectorAll('.field-error')) el.textContent = '';
      summary.hidden = true;
      const body = Object.fromEntries(PERIODS.map((p, i) => {
        const v = inputs[i].value.trim();
        return [p, /^-?\d+$/.test(v) ? Number(v) : v];
      }));
      if (scope.value.trim()) body.scope = scope.value.trim();
      try {
        await api('POST', `/v1/admin/consumers/${enc(id)}/limits`, body);
        toast('Record added');
        load();
      } catch (err) { showProblem(add, summary, err); }
    });
    view.append(add);
  }
}

// ---------------------------------------------------------------- tokens

export async function tokens(ctx) {
  const { view } = ctx;
  view.append(header('Tokens'));
  if (!ctx.atLeast('admin')) { view.append(h('p', {}, 'Only admin tokens manage tokens.')); return; }
  const list = h('div', { id: 'tokens' });
  const load = async () => {
    const items = await all('/v1/admin/tokens');
    list.replaceChildren(table(null, ['Name', 'Role', 'Apps', 'Created', ''], items.map((t) => h('tr', {},
      h('td', {}, t.name), h('td', {}, t.role), h('td', {}, t.apps ? t.apps.join(', ') : 'all'),
      h('td', { class: 'small' }, `${time(t.created_at)} by ${t.created_by}`),
      h('td', {}, t.name === ctx.me.name ? h('span', { class: 'muted' }, 'you') : h('button', { type: 'button', class: 'danger small', 'data-action': 'delete', onclick: async () => {
        if (!await confirmDialog(`Revoke token ${t.name}?`, 'Anything using it is refused (401) from now on.', `Revoke ${t.name}`)) return;
        try { await api('DELETE', `/v1/admin/tokens/${enc(t.name)}`); toast(`Token ${t.name} revoked`); load(); } catch (e) { toast(e.message, 'bad'); }
      } }, 'Revoke'))))));
  };
  view.append(list);
  await load();
  const name = h('input', { id: 't-name', 'data-field': 'name', required: true, 'aria-describedby': 't-name-error' });
  const role = h('select', { id: 't-role', 'data-field': 'role' }, ['viewer', 'editor', 'admin'].map((r) => h('option', { value: r }, r)));
  const apps = h('input', { id: 't-apps', 'data-field': 'apps', 'aria-describedby': 't-apps-help t-apps-error' });
  const summary = h('div', { class: 'error-summary', role: 'alert', tabindex: '-1', hidden: true });
  const secret = h('div', { id: 'secret', 'aria-live': 'polite' });
  const form = h('form', { class: 'card', novalidate: true }, h('h2', {}, 'New token'), summary,
    h('div', { class: 'grid' },
      h('div', { class: 'field' }, h('label', { for: 't-name' }, 'Name'), name, h('p', { class: 'field-error', id: 't-name-error' })),
      h('div', { class: 'field' }, h('label', { for: 't-role' }, 'Role'), role, h('p', { class: 'help' }, 'viewer reads; editor also changes policies and limits; admin also tokens.')),
      h('div', { class: 'field' }, h('label', { for: 't-apps' }, 'Apps'), apps, h('p', { class: 'help', id: 't-apps-help' }, 'Comma-separated; empty: every app.'), h('p', { class: 'field-error', id: 't-apps-error' }))),
    h('div', { class: 'actions end' }, h('button', { type: 'submit' }, 'Create token')), secret);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    summary.hidden = true;
    for (const el of form.querySelectorAll('.field-error')) el.textContent = '';
    const body = { name: name.value.trim(), role: role.value };
    if (apps.value.trim()) body.apps = splitApps(apps.value);
    try {
      const { data } = await api('POST', '/v1/admin/tokens', body);
      secret.replaceChildren(h('p', {}, `Token ${data.name} created. Copy its secret now: it is not shown again.`),
        h('code', { class: 'secret' }, data.secret));
      name.value = '';
      load();
    } catch (err) { showProblem(form, summary, err); }
  });
  view.append(form);
}

// ---------------------------------------------------------------- audit

function flatten(value, prefix = '', out = {}) {
  if (value && typeof value === 'object') {
    const entries = Array.isArray(value) ? value.map((v, i) => [`[${i}]`, v]) : Object.entries(value).map(([k, v]) => [prefix ? `.${k}` : k, v]);
    if (!entries.length) out[prefix] = JSON.stringify(value);
    for (const [k, v] of entries) flatten(v, `${prefix}${k}`, out);
  } else if (value !== undefined) {
    out[prefix] = JSON.stringify(value);
  }
  return out;
}

function diff(before, after) {
  const a = before ? flatten(before) : {};
  const b = after ? flatten(after) : {};
  const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
  const lines = [];
  for (const k of keys) {
    if (a[k] === b[k]) continue;
    if (k in a) lines.push(h('div', { class: 'del' }, h('span', { class: 'sr-only' }, 'removed: '), `− ${k}: ${a[k]}`));
    if (k in b) lines.push(h('div', { class: 'add' }, h('span', { class: 'sr-only' }, 'added: '), `+ ${k}: ${b[k]}`));
  }
  return h('div', { class: 'diff' }, lines.length ? lines : h('div', { class: 'muted' }, 'No field changed.'));
}

export async function audit(ctx) {
  const { view } = ctx;
  view.append(header('Audit log'), h('p', { class: 'muted' }, 'Every change through the management API, newest first.'));
  const body = h('tbody', {});
  const more = h('button', { type: 'button', class: 'secondary', hidden: true }, 'Load older entries');
  view.append(h('div', { class: 'table-wrap' }, h('table', { id: 'audit' },
    h('thead', {}, h('tr', {}, ['When', 'Who', 'What', 'Change'].map((c) => h('th', { scope: 'col' }, c)))), body)), more);
  let next = null;
  const load = async () => {
    const { data } = await api('GET', `/v1/admin/audit?limit=50${next ? `&after=${enc(next)}` : ''}`);
    for (const e of data.items) {
      body.append(h('tr', { 'data-subject': e.subject },
        h('td', { class: 'small' }, time(e.at)), h('td', {}, e.actor),
        h('td', {}, `${e.action} ${e.kind} `, h('strong', {}, e.subject)),
        h('td', {}, h('details', {}, h('summary', {}, 'Before / after'), diff(e.before, e.after)))));
    }
    if (!data.items.length && !body.children.length) body.append(h('tr', {}, h('td', { colspan: 4, class: 'muted' }, 'No changes yet.')));
    next = data.next || null;
    more.hidden = !next;
  };
  more.addEventListener('click', load);
  await load();
}

// ---------------------------------------------------------------- health

export async function health(ctx) {
  const { view } = ctx;
  view.append(header('Backend health'));
  const host = h('div', { id: 'health', 'aria-live': 'polite' });
  view.append(host, h('p', { class: 'muted' }, 'From /readyz and /v1/info, every 3 seconds.'));
  every(3000, async () => {
    try {
      const ready = await api('GET', '/readyz', undefined, { accept: [503], anonymous: true });
      const { data: info } = await api('GET', '/v1/info', undefined, { anonymous: true });
      const ok = ready.status === 200;
      const card = (label, value, good) => h('div', { class: `stat ${good === undefined ? '' : good ? 'good' : 'bad'}` }, h('div', { class: 'stat-label' }, label), h('div', { class: 'stat-value' }, value));
      host.replaceChildren(h('div', { class: 'stats' },
        card('Backend', `${info.backend}: ${ok ? 'answering' : 'not answering'}`, ok),
        card('Circuit breaker', info.breaker === 'closed' ? 'closed (backend in use)' : 'open (bypassed)', info.breaker === 'closed'),
        card('When the backend fails', info.on_failure),
        card('Policy database', info.database || 'none'),
        card('Version', info.version),
        card('Policies in force', String(info.policies.length + (info.stored_policies || 0)))),
      h('h2', {}, 'Policies of the configuration file'),
      h('ul', { class: 'plain' }, info.policies.map((n) => h('li', {}, h('a', { href: `#/policies/${enc(n)}` }, n)))),
      h('p', { class: 'muted' }, `And ${info.stored_policies || 0} from the policy database: see Policies.`));
    } catch (e) {
      host.replaceChildren(h('p', { class: 'error', role: 'alert' }, `The server did not answer: ${e.message}`));
    }
  });
}
