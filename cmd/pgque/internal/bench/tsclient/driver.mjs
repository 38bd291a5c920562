// TypeScript client driver for pgque's benchmark (internal/bench, suite ts).
//
// It runs the pgque package built from clients/typescript (its dist/, by
// path: the bench builds it first) and prints one JSON line of results.
// The Go side starts it with
//
//   node driver.mjs '<json config>'
//
// config: { pkg: <absolute path of dist/src/index.js>,
//           connection: {host, port, user, password, database},
//           mode: "work" | "send" | "sendBatch", queue, ... }
//
// work: { consumer, slots, concurrency, events, handlerMs, timeoutMs }
//   work() drains a backlog the Go side loaded (payloads {t, s}: tenant
//   and its sequence number, from 1). The handler checks that each
//   tenant's events come in order and that no two of a tenant's run at
//   once, then sleeps handlerMs. Timed from the first handler call to the
//   last one's end; the resident set size is sampled every 20 ms while
//   the drain runs and its peak reported.
// send: { events, tenants, callers }
//   callers concurrent loops call send() on a pg.Pool (which coalesces
//   concurrent sends) until events are sent, each with a partition key.
// sendBatch: { events, tenants, batch }
//   one loop calls sendBatch() with batch events of distinct tenants.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const cfg = JSON.parse(process.argv[2]);
const pgque = await import(pathToFileURL(cfg.pkg).href);
const pg = createRequire(cfg.pkg)('pg');

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}
function fail(msg) {
  out({ error: msg });
  process.exit(1);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function work(pool) {
  const last = new Map();
  const busy = new Set();
  let handled = 0;
  let violations = 0;
  let first = null;
  let lastEnd = 0;
  let finished;
  const allDone = new Promise((resolve) => { finished = resolve; });
  let rssPeak = 0;
  const sampler = setInterval(() => { rssPeak = Math.max(rssPeak, process.memoryUsage.rss()); }, 20);
  const errors = [];
  const worker = await pgque.work(pool, {
    queue: cfg.queue,
    consumer: cfg.consumer,
    slots: cfg.slots,
    concurrency: cfg.concurrency,
    onError: (err) => { errors.push(String(err && err.stack ? err.stack : err)); },
  }, async (msg) => {
    const { t, s } = msg.payload;
    if (busy.has(t) || s !== (last.get(t) ?? 0) + 1) violations++;
    busy.add(t);
    last.set(t, s);
    if (first === null) first = performance.now();
    try {
      if (cfg.handlerMs > 0) await sleep(cfg.handlerMs);
    } finally {
      busy.delete(t);
    }
    lastEnd = performance.now();
    if (++handled >= cfg.events) finished(true);
  });
  const timeout = setTimeout(() => finished(false), cfg.timeoutMs);
  const complete = await allDone;
  clearTimeout(timeout);
  rssPeak = Math.max(rssPeak, process.memoryUsage.rss());
  clearInterval(sampler);
  await worker.stop({ timeoutMs: 10000 });
  if (!complete) fail(`only ${handled} of ${cfg.events} events handled within ${cfg.timeoutMs} ms; errors: ${errors.slice(0, 3).join('; ')}`);
  out({ handled, work_ms: lastEnd - first, order_violations: violations, rss_peak: rssPeak, errors: errors.length });
}

function event(i) {
  const t = i % cfg.tenants;
  return { type: 'FileCreated', payload: { t, r: Math.floor(i / cfg.tenants) }, partitionKey: 'tenant-' + t };
}

async function send(pool) {
  let next = 0;
  const start = performance.now();
  await Promise.all(Array.from({ length: cfg.callers }, async () => {
    for (let i = next++; i < cfg.events; i = next++) await pgque.send(pool, cfg.queue, event(i));
  }));
  out({ events: cfg.events, ms: performance.now() - start });
}

async function sendBatch(pool) {
  const start = performance.now();
  let sent = 0;
  for (let from = 0; from < cfg.events; from += cfg.batch) {
    const evs = [];
    for (let i = from; i < Math.min(from + cfg.batch, cfg.events); i++) evs.push(event(i));
    const ids = await pgque.sendBatch(pool, cfg.queue, evs);
    if (ids.length !== evs.length) fail(`sendBatch of ${evs.length} events returned ${ids.length} ids`);
    sent += ids.length;
  }
  out({ events: sent, ms: performance.now() - start });
}

const pool = new pg.Pool({ ...cfg.connection, max: cfg.poolMax ?? 10 });
try {
  await { work, send, sendBatch }[cfg.mode](pool);
  await pool.end();
  process.exit(0);
} catch (err) {
  fail(String(err && err.stack ? err.stack : err));
}
