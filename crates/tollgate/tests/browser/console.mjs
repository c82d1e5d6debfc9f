// End-to-end tests of the web console in Debian's chromium, driven by playwright-core.
// Run by crates/tollgate/tests/console.rs, which starts `tollgate serve` and passes:
//   TOLLGATE_URL, ADMIN_TOKEN, VIEWER_TOKEN, SCREENSHOT_DIR (and optionally CHROMIUM).
// Prints one "ok - ..." line per step; exits 1 on the first failure (with a screenshot).

import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const BASE = need('TOLLGATE_URL');
const ADMIN = need('ADMIN_TOKEN');
const VIEWER = need('VIEWER_TOKEN');
const SHOTS = need('SCREENSHOT_DIR');
const WAIT = 20_000; // generous: the machine may be loaded
mkdirSync(SHOTS, { recursive: true });
rmSync(join(SHOTS, 'failure.png'), { force: true });

function need(name) {
  const v = process.env[name];
  if (!v) { console.error(`console.mjs: set ${name}`); process.exit(2); }
  return v;
}

function assert(cond, message) {
  if (!cond) throw new Error(`assertion failed: ${message}`);
}

const shots = [];
async function shot(page, name) {
  const path = join(SHOTS, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  shots.push(path);
  console.log(`screenshot ${path}`);
}

async function check(body) {
  const r = await fetch(`${BASE}/v1/check`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

async function signIn(page, token) {
  await page.goto(`${BASE}/console`);
  await page.getByLabel('API token').fill(token);
  await page.getByLabel('API token').press('Enter'); // the keyboard submits the form
  await page.getByRole('heading', { name: 'Policies', exact: true }).waitFor();
}

/** The chart's totals, as drawn (data attributes set by chart.js). */
async function chartTotals(page) {
  return page.$eval('#live-chart', (el) => ({ allowed: Number(el.dataset.allowed || 0), denied: Number(el.dataset.denied || 0), points: el.querySelector('polyline.allowed')?.getAttribute('points') || '' }));
}

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
let page;
let step = 'start';
try {
  const admin = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  page = await admin.newPage();
  page.setDefaultTimeout(WAIT);
  const consoleErrors = [];
  page.on('pageerror', (e) => consoleErrors.push(e.message));
  // Script errors and Content-Security-Policy violations; refused API calls (the unknown token,
  // the viewer's PUT) are expected and reported by the network, not the page.
  page.on('console', (m) => { if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) consoleErrors.push(m.text()); });

  step = 'sign-in page';
  const res = await page.goto(`${BASE}/console`);
  assert(res.status() === 200, `GET /console answered ${res.status()}`);
  await page.getByRole('heading', { name: 'Sign in' }).waitFor();
  await shot(page, '01-sign-in');
  await page.getByLabel('API token').fill('tg_not_a_token');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByText('Unknown token').waitFor();
  console.log('ok - an unknown token is refused on the sign-in page');

  step = 'admin signs in';
  await signIn(page, ADMIN);
  await page.locator('#nav a[data-nav="Tokens"]').waitFor();
  console.log('ok - an admin signs in and sees the Tokens page in the navigation');

  step = 'create a policy, with a validation message from the API';
  await page.getByRole('link', { name: 'New policy' }).click();
  await page.getByLabel('Name', { exact: true }).fill('checkout');
  await page.getByLabel('Description').fill('Checkout calls per customer');
  await page.locator('#r0-limit').fill('3');
  await page.locator('#r0-period').fill('soon');
  // Windows from each key's first hit: no clock boundary can split the test's requests.
  await page.locator('#r0-align').selectOption('first_hit');
  await page.getByRole('button', { name: 'Create policy' }).click();
  const periodError = page.locator('#r0-period-error');
  await periodError.filter({ hasText: /\S/ }).waitFor();
  const errorText = await periodError.textContent();
  assert(await page.locator('#r0-period').getAttribute('aria-invalid') === 'true', 'the period field is marked invalid');
  assert(/soon|duration|period/i.test(errorText), `the message is the API's: ${errorText}`);
  console.log(`ok - the API's problem+json message is shown next to rules[0].period: "${errorText}"`);
  await shot(page, '02-policy-form-error');
  const unlabelled = await page.$$eval('main input, main select', (els) => els.filter((el) => !el.labels?.length && !el.getAttribute('aria-label')).map((el) => el.id || el.outerHTML));
  assert(unlabelled.length === 0, `every field has a label: ${unlabelled}`);
  // Keyboard: the error summary and fields are reachable, and Tab moves through real controls.
  await page.locator('#r0-period').focus();
  await page.keyboard.press('Tab');
  assert(await page.evaluate(() => document.activeElement.id) === 'r0-align', 'Tab goes from period to align');
  console.log('ok - every form field has a label, and Tab follows the form');
  await page.locator('#r0-period').fill('1h');
  await page.getByRole('button', { name: 'Create policy' }).click();
  await page.getByRole('heading', { name: 'Policy checkout' }).waitFor();
  console.log('ok - the policy is created');

  step = 'the created policy is enforced';
  const codes = [];
  for (let i = 0; i < 4; i++) codes.push((await check({ key: 'e2e-a', policy: 'checkout' })).status);
  assert(codes.join() === '200,200,200,429', `3 per hour: ${codes}`);
  console.log(`ok - /v1/check enforces it: ${codes}`);

  step = 'edit the policy';
  await page.getByRole('link', { name: 'Edit' }).click();
  await page.locator('#r0-limit').fill('5');
  await page.getByRole('button', { name: 'Save changes' }).click();
  await page.getByRole('heading', { name: 'Policy checkout' }).waitFor();
  await page.getByText('5 per 1h').first().waitFor();
  const codes2 = [];
  for (let i = 0; i < 6; i++) codes2.push((await check({ key: 'e2e-b', policy: 'checkout' })).status);
  assert(codes2.join() === '200,200,200,200,200,429', `5 per hour after the edit: ${codes2}`);
  console.log(`ok - the edit applies at once: ${codes2}`);

  step = 'the live chart moves while a load runs';
  await page.waitForFunction(() => document.querySelector('#live-chart svg'));
  const before = await chartTotals(page);
  let fired = { allowed: 0, denied: 0 };
  const load = (async () => {
    for (let i = 0; i < 48; i++) {
      const r = await check({ key: `load-${i % 8}`, policy: 'checkout' });
      fired[r.status === 200 ? 'allowed' : 'denied']++;
      await new Promise((ok) => setTimeout(ok, 50));
    }
  })();
  await page.waitForFunction((b) => {
    const el = document.querySelector('#live-chart');
    return Number(el.dataset.allowed) > b.allowed && Number(el.dataset.denied) > b.denied;
  }, before, { timeout: WAIT });
  const during = await chartTotals(page);
  await load;
  await page.waitForFunction((want) => {
    const el = document.querySelector('#live-chart');
    return Number(el.dataset.allowed) >= want.allowed && Number(el.dataset.denied) >= want.denied;
  }, { allowed: before.allowed + fired.allowed, denied: before.denied + fired.denied }, { timeout: WAIT });
  const after = await chartTotals(page);
  assert(after.points !== before.points, 'the allowed line was redrawn');
  console.log(`ok - the chart moved by itself: allowed ${before.allowed} -> ${during.allowed} -> ${after.allowed}, denied ${before.denied} -> ${during.denied} -> ${after.denied} (load: ${fired.allowed} allowed, ${fired.denied} denied)`);
  await page.locator('#nearest code', { hasText: /^(load-\d|e2e-[ab])$/ }).first().waitFor();
  const nearestFirst = await page.locator('#nearest tbody tr').first().textContent();
  assert(/\b0 \/ \d+/.test(nearestFirst), `the nearest key is at its limit: ${nearestFirst}`);
  console.log(`ok - keys nearest their limits are listed: "${nearestFirst.trim()}"`);

  step = 'look up a key';
  await page.getByLabel('Key', { exact: true }).fill('e2e-b');
  await page.getByRole('button', { name: 'Look up' }).click();
  const countdown = page.locator('#lookup-result .countdown').first();
  await countdown.waitFor();
  await page.locator('#lookup-result').getByText('0 / 5').waitFor();
  const t1 = await countdown.textContent();
  await page.waitForFunction((t) => document.querySelector('#lookup-result .countdown')?.textContent !== t, t1, { timeout: 5000 });
  const t2 = await countdown.textContent();
  const peek = await check({ key: 'e2e-b', policy: 'checkout', cost: 0 });
  assert(peek.body.remaining === 0, 'the lookups only peeked');
  console.log(`ok - the key lookup shows 0 / 5 and counts down to reset: "${t1}" -> "${t2}"`);
  await page.getByRole('button', { name: 'Last 2 minutes' }).click();
  assert(await page.getByRole('button', { name: 'Last 2 minutes' }).getAttribute('aria-pressed') === 'true', 'the range button is pressed');
  await page.locator('#live-chart svg[aria-label*="last 120 seconds"]').waitFor();
  await shot(page, '03-policy-live');

  step = 'policies list and search';
  await page.getByRole('link', { name: 'Policies', exact: true }).click();
  await page.locator('tr[data-policy="checkout"]').waitFor();
  await page.getByLabel('Search').fill('no-such-thing');
  await page.getByText('No policy matches.').waitFor();
  await page.getByLabel('Search').fill('checkout');
  await page.locator('tr[data-policy="checkout"]').waitFor();
  await page.getByLabel('Search').fill('');
  await shot(page, '04-policies');
  console.log('ok - the policies list filters by search');

  step = 'the audit log shows the change with its diff';
  await page.getByRole('link', { name: 'Audit log' }).click();
  const entry = page.locator('#audit tr[data-subject="checkout"]', { hasText: 'update' }).first();
  await entry.waitFor();
  await entry.getByText('Before / after').click();
  await entry.locator('.diff .del', { hasText: 'limit: 3' }).waitFor();
  await entry.locator('.diff .add', { hasText: 'limit: 5' }).waitFor();
  await shot(page, '05-audit');
  console.log('ok - the audit entry of the edit shows limit 3 -> 5');

  step = 'consumers: add a limit record and watch its usage';
  await page.getByRole('link', { name: 'Consumers' }).click();
  await page.getByLabel('Consumer id').fill('acme');
  await page.getByRole('button', { name: 'Show' }).click();
  await page.getByRole('heading', { name: 'Add a limit record' }).waitFor();
  await page.locator('#c-per_hour').fill('10');
  await page.getByRole('button', { name: 'Add record' }).click();
  await page.locator('#records tbody tr').first().waitFor();
  // The server applies the new record at once (its own change).
  for (let i = 0; i < 3; i++) await check({ consumer: 'acme' });
  await page.locator('#call-limits').getByText('3 of 10 made').waitFor();
  await shot(page, '06-consumers');
  console.log('ok - a consumer limit record is added and the live call-limits show 3 calls made');

  step = 'tokens (admin)';
  await page.getByRole('link', { name: 'Tokens' }).click();
  await page.getByLabel('Name').fill('e2e-made');
  await page.getByRole('button', { name: 'Create token' }).click();
  const secret = await page.locator('#secret code').textContent();
  assert(secret.startsWith('tg_'), 'the new secret is shown once');
  await page.locator('#tokens td', { hasText: 'e2e-made' }).waitFor();
  await shot(page, '07-tokens');
  console.log('ok - an admin creates a token and sees its secret once');

  step = 'health';
  await page.getByRole('link', { name: 'Health' }).click();
  await page.getByText('memory: answering').waitFor();
  await shot(page, '08-health');
  console.log('ok - backend health shows the memory backend answering');

  step = 'a viewer sees no edit controls, and the API refuses its edit';
  const viewerContext = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const viewer = await viewerContext.newPage();
  viewer.setDefaultTimeout(WAIT);
  await signIn(viewer, VIEWER);
  await viewer.locator('tr[data-policy="checkout"]').waitFor();
  const controls = async () => viewer.locator('main').locator('a.button, button[data-action="delete"], button:has-text("Create"), a:has-text("Edit"), a:has-text("New policy")').count();
  assert(await controls() === 0, 'no create/edit/delete control on the policies page');
  assert(await viewer.locator('#nav a[data-nav="Tokens"]').count() === 0, 'no Tokens page for a viewer');
  await shot(viewer, '09-viewer-policies');
  await viewer.locator('tr[data-policy="checkout"] a').click();
  await viewer.getByRole('heading', { name: 'Policy checkout' }).waitFor();
  await viewer.waitForFunction(() => document.querySelector('#live-chart svg'));
  assert(await controls() === 0, 'no edit/delete control on the policy page');
  await shot(viewer, '10-viewer-policy');
  const refusal = await viewer.evaluate(async () => {
    const token = sessionStorage.getItem('tollgate.token');
    const r = await fetch('/v1/admin/policies/checkout', {
      method: 'PUT',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({ rules: [{ algorithm: 'fixed_window', limit: 1000, period: '1h' }] }),
    });
    return { status: r.status, type: r.headers.get('content-type'), body: await r.json() };
  });
  assert(refusal.status === 403 && refusal.type.startsWith('application/problem+json') && refusal.body.type.endsWith('#forbidden'), `the API refuses: ${JSON.stringify(refusal)}`);
  console.log(`ok - a viewer has no edit controls, and its PUT is refused: ${refusal.status} ${refusal.body.detail}`);

  step = 'narrow screens';
  await page.setViewportSize({ width: 360, height: 740 });
  await page.getByRole('link', { name: 'Policies', exact: true }).click();
  await page.locator('tr[data-policy="checkout"]').waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert(overflow <= 0, `the page does not scroll sideways at 360 px (by ${overflow} px)`);
  await shot(page, '11-policies-360px');
  await page.locator('tr[data-policy="checkout"] a').first().click();
  await page.waitForFunction(() => document.querySelector('#live-chart svg'));
  const overflow2 = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert(overflow2 <= 0, `the policy page does not scroll sideways at 360 px (by ${overflow2} px)`);
  await shot(page, '12-policy-360px');
  await page.setViewportSize({ width: 1280, height: 900 });
  console.log('ok - pages fit 360 px');

  step = 'delete the policy with confirmation';
  await page.getByRole('link', { name: 'Policies', exact: true }).click();
  await page.locator('tr[data-policy="checkout"] button[data-action="delete"]').click();
  const dialog = page.getByRole('dialog');
  await dialog.waitFor();
  await shot(page, '13-delete-confirmation');
  await dialog.getByRole('button', { name: 'Cancel' }).click();
  assert(await page.locator('tr[data-policy="checkout"]').count() === 1, 'cancel keeps the policy');
  await page.locator('tr[data-policy="checkout"] button[data-action="delete"]').click();
  await page.getByRole('dialog').getByRole('button', { name: 'Delete checkout' }).click();
  await page.locator('tr[data-policy="checkout"]').waitFor({ state: 'detached' });
  const gone = await check({ key: 'e2e-a', policy: 'checkout' });
  assert(gone.status === 404 && gone.body.type.endsWith('#unknown-policy'), `checks of a deleted policy: ${gone.status}`);
  console.log('ok - the policy is deleted after confirmation, and /v1/check answers 404');

  step = 'the audit log shows the deletion';
  await page.getByRole('link', { name: 'Audit log' }).click();
  await page.locator('#audit tr[data-subject="checkout"]', { hasText: 'delete' }).first().waitFor();
  console.log('ok - the deletion is in the audit log');

  assert(consoleErrors.length === 0, `no script errors: ${consoleErrors.join('; ')}`);
  console.log(`ok - all steps passed; ${shots.length} screenshots in ${SHOTS}`);
  await browser.close();
} catch (e) {
  console.error(`FAILED at step "${step}": ${e.stack || e}`);
  if (page) {
    try { await page.screenshot({ path: join(SHOTS, 'failure.png'), fullPage: true }); console.error(`screenshot ${join(SHOTS, 'failure.png')}`); } catch {}
  }
  await browser.close();
  process.exit(1);
}
