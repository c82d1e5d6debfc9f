// The live chart: allowed and denied checks per second, drawn as SVG at the host's width.

const NS = 'http://www.w3.org/2000/svg';
const H = 220;
const PAD = { left: 44, right: 10, top: 10, bottom: 26 };

function svg(tag, attrs = {}, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function niceMax(v) {
  if (v <= 1) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function xy(series, max, width) {
  const n = series.length;
  const w = width - PAD.left - PAD.right;
  const h = H - PAD.top - PAD.bottom;
  return series.map((v, i) => [PAD.left + (i * w) / Math.max(1, n - 1), PAD.top + h - (v / max) * h]);
}

const fmt = (pts) => pts.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(' ');

function tickLabels(seconds) {
  if (seconds >= 900) return [['−15 min', 0], ['−10', 1 / 3], ['−5', 2 / 3], ['now', 1]];
  return [[`−${seconds} s`, 0], [`−${Math.round((seconds * 2) / 3)}`, 1 / 3], [`−${Math.round(seconds / 3)}`, 2 / 3], ['now', 1]];
}

/**
 * Draws the last `seconds` of `live` (the answer of /v1/admin/live/policies/{name}) into
 * `host`, and answers the totals (over the whole window and the last minute).
 */
export function drawChart(host, live, seconds = 900) {
  const all = {
    allowed: live.allowed,
    denied: live.denied.map((d, i) => d + (live.shadow_denied?.[i] || 0)),
  };
  const from = Math.max(0, all.allowed.length - seconds);
  const allowed = all.allowed.slice(from);
  const denied = all.denied.slice(from);
  const max = niceMax(Math.max(1, ...allowed, ...denied));
  const sum = (a, n) => a.slice(a.length - n).reduce((x, y) => x + y, 0);
  const totals = {
    allowed: sum(all.allowed, all.allowed.length),
    denied: sum(all.denied, all.denied.length),
    minuteAllowed: sum(all.allowed, 60),
    minuteDenied: sum(all.denied, 60),
  };
  const width = Math.max(280, Math.round(host.clientWidth || 900) - 18);
  const root = svg('svg', {
    viewBox: `0 0 ${width} ${H}`,
    width,
    height: H,
    role: 'img',
    class: 'chart',
    'aria-label': `Checks per second over the last ${seconds >= 900 ? '15 minutes' : `${seconds} seconds`}: ${sum(allowed, allowed.length)} allowed, ${sum(denied, denied.length)} denied`,
  });
  const h = H - PAD.top - PAD.bottom;
  for (const f of [0, 0.5, 1]) {
    const y = PAD.top + h - f * h;
    root.append(svg('line', { x1: PAD.left, x2: width - PAD.right, y1: y, y2: y, class: 'grid' }));
    root.append(svg('text', { x: PAD.left - 6, y: y + 4, class: 'tick', 'text-anchor': 'end' }, String(+(f * max).toFixed(1))));
  }
  for (const [text, f] of tickLabels(seconds)) {
    const x = PAD.left + f * (width - PAD.left - PAD.right);
    root.append(svg('text', { x, y: H - 6, class: 'tick', 'text-anchor': f === 0 ? 'start' : f === 1 ? 'end' : 'middle' }, text));
  }
  const a = xy(allowed, max, width);
  const base = PAD.top + h;
  root.append(svg('polygon', { points: `${a[0][0]},${base} ${fmt(a)} ${a[a.length - 1][0]},${base}`, class: 'area allowed' }));
  root.append(svg('polyline', { points: fmt(a), class: 'line allowed' }));
  root.append(svg('polyline', { points: fmt(xy(denied, max, width)), class: 'line denied' }));
  host.replaceChildren(root);
  host.dataset.allowed = String(totals.allowed);
  host.dataset.denied = String(totals.denied);
  return totals;
}
