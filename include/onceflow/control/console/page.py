"""The console's page: one HTML document per section, with the section's data fetched from the console's JSON
endpoints and refreshed without a reload. Plain HTML, CSS and JavaScript (charts are inline SVG): nothing is loaded
from outside the Airflow API server, which may have no internet access."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence

TITLES = {
    "now": "Now",
    "batches": "Batches",
    "transactions": "Transactions & alerts",
    "savepoints": "Savepoints",
    "proofs": "Reconciliation & backfills",
}

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1f2933;background:#f7f8fa}
header{background:#fff;border-bottom:1px solid #dde1e6;padding:10px 18px;display:flex;gap:18px;align-items:center}
header h1{font-size:17px;margin:0 12px 0 0} header a{color:#3b5b7d;text-decoration:none;padding:6px 8px;border-radius:6px}
header a.on{background:#e6eef7;font-weight:600} main{padding:16px 18px}
nav.apps{background:#fff;border-bottom:1px solid #dde1e6;padding:6px 18px;display:flex;gap:10px;align-items:center;font-size:13px}
nav.apps a{color:#3b5b7d;text-decoration:none;padding:3px 8px;border-radius:6px;border:1px solid #dde1e6}
nav.apps a.on{background:#e6eef7;font-weight:600}
.banner{padding:8px 12px;border-radius:6px;margin-bottom:12px;background:#fdecea;color:#8a1c13;display:none}
.banner.show{display:block} .muted{color:#6b7785} .ok{color:#1e7d32} .bad{color:#b3261e} .warn{color:#a15c00}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(210px,1fr));gap:10px;margin-bottom:14px}
.card{background:#fff;border:1px solid #dde1e6;border-radius:8px;padding:10px 12px}
.card .k{font-size:12px;color:#6b7785}.card .v{font-size:19px;margin-top:3px;word-break:break-all}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #dde1e6;font-size:13px;margin-bottom:14px}
th,td{padding:5px 8px;border-bottom:1px solid #eef0f3;text-align:left;vertical-align:top} th{background:#f1f3f6}
h2{font-size:15px;margin:18px 0 8px} code,pre{font-family:ui-monospace,Menlo,monospace;font-size:12px}
pre{white-space:pre-wrap;margin:0} button{padding:5px 10px;border-radius:6px;border:1px solid #9fb3c8;
background:#fff;cursor:pointer} button.primary{background:#3b5b7d;color:#fff;border-color:#3b5b7d}
form.filters,form.backfill{display:flex;flex-wrap:wrap;gap:8px;align-items:end;margin-bottom:10px}
label{font-size:12px;color:#4b5866;display:flex;flex-direction:column;gap:3px} input{padding:4px 6px}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:10px}
.chart{background:#fff;border:1px solid #dde1e6;border-radius:8px;padding:8px} .chart svg{width:100%;height:130px}
.pill{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;background:#eef0f3}
.pill.ok{background:#e3f4e6}.pill.bad{background:#fdecea}.pill.warn{background:#fff2dd}
#flash{margin:6px 0 10px;font-size:13px}
"""

SCRIPT = r"""
// Everything shown comes from Kafka records: untrusted. Every value put into markup goes through esc() (or a helper
// that calls it); tests/unit/control/test_console.py fails on a ${...} hole that does not.
const esc = s => String(s ?? '-').replace(/[&<>"'`]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;','`':'&#96;'}[c]));
const fmtMs = ms => { const d = new Date(Number(ms)); return ms && isFinite(d) ? d.toISOString().replace('T',' ').replace('.000Z','Z') : '-'; };
const pill = (v, good, bad) => `<span class="pill ${good.includes(v)?'ok':bad.includes(v)?'bad':'warn'}">${esc(v)}</span>`;
async function get(path){
  const r = await fetch(BASE + path, {credentials:'same-origin'});
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  const body = await r.json();
  const b = document.getElementById('banner');
  if (!body.ok) { b.classList.add('show');
    b.textContent = `${body.error}` + (body.stale ? ` Showing the last known state, as of ${fmtMs(body.as_of_ms)}.`
                                                  : ' No earlier state is known.'); }
  else b.classList.remove('show');
  return body;
}
async function trigger(dagId, conf, what){
  const f = document.getElementById('flash');
  f.textContent = `${what}: triggering ${dagId} ...`;
  const r = await fetch(`/api/v2/dags/${dagId}/dagRuns`, {method:'POST', credentials:'same-origin',
    headers:{'Content-Type':'application/json'}, body: JSON.stringify({logical_date:null, conf,
    note:`${what} (from the onceflow console)`})});
  const body = await r.json().catch(() => ({}));
  if (!r.ok) { f.innerHTML = `<span class="bad">${esc(what)} refused: HTTP ${esc(r.status)} ${esc(JSON.stringify(body.detail ?? body))}</span>`; return null; }
  f.innerHTML = `<span class="ok">${esc(what)}: run <a target="_top" href="/dags/${encodeURIComponent(dagId)}/runs/${encodeURIComponent(body.dag_run_id)}">${esc(body.dag_run_id)}</a> of ${esc(dagId)} triggered</span>`;
  return body;
}
function chart(title, points, unit){
  if (!points || points.length < 2) return `<div class="chart"><b>${esc(title)}</b><div class="muted">not enough data yet</div></div>`;
  const xs = points.map(p=>p[0]), ys = points.map(p=>p[1]);
  const x0=Math.min(...xs), x1=Math.max(...xs), y1=Math.max(...ys, 1);
  const pts = points.map(p => `${((p[0]-x0)/(x1-x0||1)*300).toFixed(1)},${(120-(p[1]/y1)*110).toFixed(1)}`).join(' ');
  return `<div class="chart"><b>${esc(title)}</b> <span class="muted">max ${esc(y1.toLocaleString())} ${esc(unit)}, ${fmtMs(x0)} .. ${fmtMs(x1)}</span>
    <svg viewBox="0 0 300 125" preserveAspectRatio="none"><polyline fill="none" stroke="#3b5b7d" stroke-width="1.5" points="${esc(pts)}"/></svg></div>`;
}
// card(k, html, cls): html is markup built with esc() by the caller
const card = (k, v, cls) => `<div class="card"><div class="k">${esc(k)}</div><div class="v ${esc(cls||'')}">${v}</div></div>`;

async function renderNow(){
  const b = await get('/api/now'); const d = b.data; if (!d) return;
  const txnCls = d.open_transaction_age_s > 0.8*d.transaction_timeout_s ? 'bad' : '';
  const wmCls = d.watermark_lag_s !== null && Math.abs(d.watermark_lag_s) > 3600 ? 'warn' : '';
  document.getElementById('content').innerHTML = `<div class="cards">
    ${card('desired / actual', `${esc(d.desired_state)} / ${pill(d.state, ['running'], ['failed','stopped (not running)'])}`)}
    ${card('driver', `${esc(d.where.host)} pid ${esc(d.where.job_pid)}`)}
    ${card('last committed batch', `${esc(d.last_batch)} <span class="muted">${esc(d.last_commit_age_s)} s ago</span>`)}
    ${card('watermark', `${fmtMs(d.watermark_ms)}<div class="muted">${esc(d.watermark_lag_s)} s behind wall-clock</div>`, wmCls)}
    ${card('input rate', `${esc(d.input_rows_per_s)} rec/s <span class="muted">processed ${esc(d.processed_rows_per_s)}</span>`)}
    ${card('batch time', `${esc(d.batch_duration_ms)} ms <span class="muted">txn ${esc(d.last_txn_ms)} ms</span>`)}
    ${card('batch running', d.running_batch !== null ? `${esc(d.running_batch)} for ${esc(d.running_batch_s)} s` : 'none')}
    ${card('open transaction', d.open_transaction_age_s !== null ? `${esc(d.open_transaction_age_s)} s of ${esc(d.transaction_timeout_s)} s` : 'none', txnCls)}
    ${card('restarts', `supervisor ${esc(d.restarts)} · health ${esc(d.health_restarts)}`)}
    ${card('health', `${pill(d.health_status, ['HEALTHY'], ['FAILING','STOPPED'])} <span class="muted">${fmtMs(d.health_ts_ms)}</span>`)}
    ${card('total lag', esc(d.total_lag))}
  </div>
  ${d.error ? `<div class="card bad">last error: <pre>${esc(d.error)}</pre></div>` : ''}
  <h2>Lag per partition (Burrow's rules over the health runs)</h2>
  <table><tr><th>partition</th><th>lag</th><th>status</th><th>trend</th></tr>
  ${d.partitions.map(p => `<tr><td>${esc(p.partition)}</td><td>${esc(p.lag)}</td><td>${pill(p.status,['OK'],['STALL','STOP','ERR','REWIND'])}</td><td>${esc(p.trend)}</td></tr>`).join('')}</table>
  ${d.health_problems.length ? `<h2>Problems health reports</h2><ul>${d.health_problems.map(p=>`<li>${esc(p)}</li>`).join('')}</ul>` : ''}
  <p class="muted">checkpoint ${esc(d.where.checkpoint)} · transactional id ${esc(d.where.transactional_id)} · Kafka ${esc(d.where.bootstrap_servers)}</p>`;
}

let before = null;
async function renderBatches(){
  const q = new URLSearchParams(new FormData(document.getElementById('filters')));
  for (const [k,v] of [...q]) if (!v) q.delete(k);
  if (before !== null) q.set('before', before);
  const b = await get('/api/batches?' + q); const c = await get('/api/charts');
  const rows = (b.data || {}).rows || [];
  document.getElementById('charts').innerHTML = c.data ? chart('lag (records)', c.data.lag, 'records')
    + chart('throughput', c.data.throughput, 'records/s') + chart('transaction time', c.data.txn_ms, 'ms') : '';
  document.getElementById('table').innerHTML = `<table><tr><th>batch</th><th>epoch</th><th>ranges [start, end)</th>
    <th>records</th><th>outputs</th><th>DLQ</th><th>late</th><th>txn ms</th><th>committed</th></tr>
    ${rows.map(r => `<tr><td>${esc(r.batch)}${r.spark_batch!==r.batch&&r.spark_batch!==null?` <span class="muted">(spark ${esc(r.spark_batch)})</span>`:''}</td>
    <td>${esc(r.epoch)}</td><td><code>${esc(Object.entries(r.ranges).map(([p,x])=>`${p}:[${x[0]},${x[1]})`).join(' '))}</code></td>
    <td>${esc(r.records)}</td><td>${esc(r.outputs)}${r.outputs_by_topic ? ` <span class="muted">(${esc(Object.entries(r.outputs_by_topic).map(([t,n])=>`${t} ${n}`).join(', '))})</span>` : ''}</td><td>${esc(r.dlq)}</td><td>${esc(r.late)}</td><td>${esc(r.txn_ms)}</td><td>${fmtMs(r.commit_ms)}</td></tr>`).join('')}
    </table>` + (b.data && b.data.next_before !== null ? `<button id="older">older batches</button>` : '');
  const o = document.getElementById('older');
  if (o) o.onclick = () => { before = b.data.next_before; renderBatches(); };
}

async function renderTransactions(){
  const t = await get('/api/transactions'); const a = await get('/api/alerts');
  const inc = (t.data || {}).incidents || []; const al = a.data || {open:[], history:[]};
  document.getElementById('content').innerHTML = `<h2>Transactions</h2>
    <p class="muted">watched: ${esc(((t.data||{}).watched_topics||[]).join(', '))}</p>
    <table><tr><th>when</th><th>what</th><th>where</th><th>detail</th><th>how to resolve</th></tr>
    ${inc.map(i => `<tr><td>${fmtMs(i.ts_ms)}</td><td>${pill(i.kind,['open_transaction','producer_replaced'],['transaction_timeout','fenced','hanging_transaction'])}</td>
      <td>${i.topic ? `${esc(i.topic)}[${esc(i.partition)}] ${esc(i.who)}` : `batch ${esc(i.batch)} ${esc(i.host)} pid ${esc(i.pid)}`}</td>
      <td>${i.age_s!==undefined?`open ${esc(i.age_s)} s`:''} ${i.elapsed_ms?`${esc(i.elapsed_ms)} ms of ${esc(i.timeout_ms)} ms`:''} ${esc(i.detail||'')}</td>
      <td><code>${esc(i.resolve)}</code></td></tr>`).join('') || '<tr><td colspan=5 class="muted">none</td></tr>'}</table>
    <h2>Alerts open now</h2>
    <table><tr><th>since</th><th>severity</th><th>alert</th><th>what to do</th></tr>
    ${al.open.map(x => `<tr><td>${fmtMs(x.ts_ms)}</td><td>${pill(x.severity,['info'],['critical'])}</td><td>${esc(x.summary)}</td><td>${esc(x.action)}</td></tr>`).join('') || '<tr><td colspan=4 class="muted">none</td></tr>'}</table>
    <h2>Alert history</h2>
    <table><tr><th>when</th><th>status</th><th>from</th><th>key</th><th>summary</th></tr>
    ${al.history.slice(0,200).map(x => `<tr><td>${fmtMs(x.ts_ms)}</td><td>${pill(x.status,['resolved'],['firing'])}</td><td>${esc(x.source)}</td><td><code>${esc(x.key)}</code></td><td>${esc(x.summary)}</td></tr>`).join('')}</table>`;
}

async function renderSavepoints(){
  const b = await get('/api/savepoints'); const rows = (b.data || {}).savepoints || [];
  const newest = rows.filter(r => r.complete)[0];
  document.getElementById('content').innerHTML = `<p><button class="primary" id="take">Take a savepoint now</button>
    <span class="muted">(runs ${esc(APP)}_checkpoint_rotation: savepoint, verification, retention)</span></p>
    <table><tr><th>savepoint</th><th>taken</th><th>batch</th><th>mode</th><th>size</th><th>verification</th><th></th></tr>
    ${rows.map(r => `<tr><td><code>${esc(r.id)}</code></td><td>${fmtMs(r.created_ms)}</td><td>${esc(r.batch)}</td><td>${esc(r.mode)}</td>
      <td>${esc(r.size_bytes ? (r.size_bytes/1024).toFixed(0)+' KiB' : '-')}</td>
      <td>${r.complete ? (r.verified ? `${pill(r.verified,['ok'],['damaged'])} ${r.restorable===false?'<span class="warn">not restorable here</span>':''} <span class="muted">${fmtMs(r.verified_ms)}</span>` : '<span class="muted">not verified</span>') : `<span class="bad">${esc(r.error)}</span>`}
      ${r.problems.length ? `<div class="bad">${esc(r.problems.join('; '))}</div>` : ''}</td>
      <td>${r.complete ? `<button data-verify="${esc(r.id)}">verify</button> <button data-restore="${esc(r.id)}" data-rewind="${esc(Boolean(newest && newest.id !== r.id))}">restore</button>` : ''}</td></tr>`).join('')}
    </table><p class="muted">stored under ${esc((b.data||{}).uri)}</p>`;
  document.getElementById('take').onclick = () => trigger(dagOf('checkpoint_rotation'), {action:'rotate'}, 'take a savepoint');
  document.querySelectorAll('[data-verify]').forEach(x => x.onclick = () =>
    trigger(dagOf('checkpoint_rotation'), {action:'verify', savepoint_id:x.dataset.verify}, `verify ${x.dataset.verify}`));
  document.querySelectorAll('[data-restore]').forEach(x => x.onclick = () => {
    const rewind = x.dataset.rewind === 'true';
    const ask = rewind ? `${x.dataset.restore} is older than the newest savepoint: restoring it is a REWIND. The job `
        + `rebuilds its state from that batch and skips the batches committed since (their results stay as committed). Rewind?`
      : `Restore ${x.dataset.restore}? The job is stopped, the checkpoint replaced (the old one is kept aside) and the job started again.`;
    if (!window.confirm(ask)) { document.getElementById('flash').textContent = 'restore cancelled'; return; }
    trigger(dagOf('deploy'), {action:'restore', savepoint_id:x.dataset.restore, allow_rewind:rewind,
                                wait_timeout_s:300}, `restore ${x.dataset.restore}${rewind?' (rewind)':''}`);
  });
}

async function renderProofs(){
  const p = await get('/api/proofs'); const bf = await get('/api/backfills');
  // offsets by partition, or by topic:partition for an app of several source topics (docs/backfill.md)
  const srcs = (bf.data||{}).sources || [];
  const example = v => JSON.stringify(Object.fromEntries((srcs.length > 1 ? srcs.map(t => t + ':0') : ['0', '1']).map(k => [k, v])));
  const d = p.data || {chain:{}, runs:[]}; const c = d.chain || {};
  const rng = rs => (rs||[]).map(r => r[0]===r[1] ? r[0] : `${r[0]}..${r[1]}`).join(', ') || 'none';
  document.getElementById('content').innerHTML = `<div class="cards">
    ${card('proven', esc(c.proven_through ?? 'nothing yet'), 'ok')} ${card('pending', esc(rng(c.pending)))}
    ${card('failed', esc(rng(c.failed)), (c.failed||[]).length ? 'bad' : '')}
    ${card('newest committed batch', esc(c.newest_committed_batch))}</div>
    <p class="muted">The scheduled chain proves every committed batch once; its position moves only with a recorded proof.
    <a href="${esc(BASE)}/data-docs/index.html" target="_blank">Great Expectations Data Docs</a></p>
    <h2>Reconciliation runs</h2>
    ${d.runs.map(r => `<details ${r.ok?'':'open'}><summary>${fmtMs(r.finished_ms)} · ${esc(r.mode)} · ${r.batches[0] === null ? 'no new batch' : `batches ${esc(r.batches[0])}..${esc(r.batches[1])}`} · ${pill(r.verdict,['ok','nothing new'],['failed'])} <span class="muted">${esc(r.run_id)}</span></summary>
      <table><tr><th>check</th><th>status</th><th>summary</th><th>differences</th></tr>
      ${r.checks.map(k => `<tr><td>${esc(k.name)}</td><td>${pill(k.status,['pass','skip'],['fail'])}</td><td>${esc(k.summary)}</td><td><pre>${esc(k.differences.map(x=>JSON.stringify(x)).join('\n'))}</pre></td></tr>`).join('')}</table></details>`).join('') || '<p class="muted">no run yet</p>'}
    <h2>Backfills <span class="muted">(into ${esc((bf.data||{}).topic)})</span></h2>
    <table><tr><th>id</th><th>chunks</th><th>records</th><th>range</th><th>last chunk</th><th>now</th></tr>
    ${((bf.data||{}).backfills||[]).map(x => `<tr><td><code>${esc(x.id)}</code></td><td>${esc(x.chunks)}${x.total_chunks ? ` of ${esc(x.total_chunks)}` : ''} ${x.complete ? '<span class="pill ok">complete</span>' : ''}</td><td>${esc(x.records)}</td>
      <td><code>${esc(x.ranges ? Object.entries(x.ranges).map(([p,r])=>`${p}:[${r[0]},${r[1]})`).join(' ') : '-')}</code></td>
      <td>${fmtMs(x.last_ms)}</td><td>${x.running ? `running (pid ${esc(x.running.pid)})` : ''}</td></tr>`).join('') || '<tr><td colspan=6 class="muted">none</td></tr>'}</table>
    <h2>Start a backfill</h2>
    <form class="backfill" id="bfform"><label>id<input name="backfill_id" required pattern="[A-Za-z0-9][A-Za-z0-9_\\-]{0,63}"></label>
      <label>start offsets (JSON)<input name="start_offsets" placeholder="${esc(example(0))}"></label>
      <label>end offsets (JSON)<input name="end_offsets" placeholder="${esc(example(500))}"></label>
      <label>or since (ISO-8601)<input name="since"></label><label>until<input name="until"></label>
      <label>target topic<input name="target_topic" placeholder="default"></label>
      <label>chunk size<input name="chunk_size" type="number" value="5000" min="1"></label>
      <label>dry run<input name="dry_run" type="checkbox"></label><button class="primary">Start</button></form>`;
  document.getElementById('bfform').onsubmit = ev => { ev.preventDefault();
    const f = new FormData(ev.target); const j = k => f.get(k) ? JSON.parse(f.get(k)) : null;
    let conf;
    try { conf = {backfill_id:f.get('backfill_id'), start_offsets:j('start_offsets'), end_offsets:j('end_offsets'),
      since:f.get('since')||null, until:f.get('until')||null, target_topic:f.get('target_topic')||null,
      chunk_size:Number(f.get('chunk_size')), dry_run:f.get('dry_run')==='on'}; }
    catch (e) { document.getElementById('flash').innerHTML = `<span class="bad">offsets must be JSON objects: ${esc(e.message)}</span>`; return; }
    trigger(dagOf('backfill'), conf, `backfill ${conf.backfill_id}`); };
}

const RENDER = {now: renderNow, batches: renderBatches, transactions: renderTransactions, savepoints: renderSavepoints,
                proofs: renderProofs};
const REFRESH_S = {now: 5, batches: 15, transactions: 10, savepoints: 20, proofs: 30};
async function refresh(){
  try { await RENDER[SECTION](); document.getElementById('updated').textContent = 'updated ' + fmtMs(Date.now()); }
  catch (e) { const b = document.getElementById('banner'); b.classList.add('show'); b.textContent = e.message; }
}
if (SECTION === 'batches') document.getElementById('filters').onsubmit = e => { e.preventDefault(); before = null; refresh(); };
refresh(); setInterval(() => { if (SECTION !== 'batches' || before === null) refresh(); }, REFRESH_S[SECTION]*1000);
"""

FILTERS = """<form class="filters" id="filters"><label>from batch<input name="batch_from" type="number" min="0"></label>
<label>to batch<input name="batch_to" type="number" min="0"></label>
<label>txn ms at least<input name="min_txn_ms" type="number" min="0"></label>
<label>with DLQ<input name="with_dlq" type="checkbox" value="true"></label>
<label>with late<input name="with_late" type="checkbox" value="true"></label>
<label>per page<input name="size" type="number" value="50" min="1" max="500"></label><button>Filter</button></form>
<div class="charts" id="charts"></div><div id="table"></div>"""


def csp(nonce: str) -> str:
    """The console page's Content-Security-Policy: its own two scripts (by nonce) and nothing else runs, not even a
    handler attribute a value from Kafka might smuggle in; it talks to its own origin only (the console's JSON and
    Airflow's REST API) and is framed only by Airflow."""
    return (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; object-src 'none'; frame-ancestors 'self'"
    )


def render(section: str, base: str, app_id: str, nonce: str, apps: Sequence[tuple[str, str, str]] = ()) -> str:
    """The page of `section` of app instance `app_id`, whose console answers under `base`; `apps`: every instance
    of this control plane as (app id, app, the same page's address for it): the app selector, when there is more
    than one."""
    nav = "".join(
        f'<a href="{html.escape(base)}/{s}" class="{"on" if s == section else ""}">{t}</a>' for s, t in TITLES.items()
    )
    selector = ""
    if len(apps) > 1:
        links = "".join(
            f'<a href="{html.escape(href)}" class="{"on" if a == app_id else ""}" data-app="{html.escape(a)}"'
            f' title="app {html.escape(name)}">{html.escape(a)}</a>'
            for a, name, href in apps
        )
        selector = f'<nav class="apps" aria-label="app"><span class="muted">app</span>{links}</nav>'
    body = FILTERS if section == "batches" else '<div id="content">loading ...</div>'
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>onceflow · {html.escape(app_id)} · {TITLES[section]}</title>
<style>{CSS}</style></head><body>
<header><h1>onceflow · {html.escape(app_id)}</h1>{nav}<span class="muted" id="updated"></span></header>{selector}
<main><div class="banner" id="banner"></div><div id="flash"></div>{body}</main>
<script nonce="{nonce}">const BASE = {_js(base)}; const SECTION = {_js(section)}; const APP = {_js(app_id)};
const dagOf = kind => APP + '_' + kind;  // the app instance's DAG of that kind (dags/onceflow_<kind>.py)</script>
<script nonce="{nonce}">{SCRIPT}</script></body></html>"""


def _js(value: str) -> str:
    """A string as a JavaScript literal inside a <script> element: JSON, with '<' escaped so that no value can close
    the element."""
    return json.dumps(value).replace("<", "\\u003c")
