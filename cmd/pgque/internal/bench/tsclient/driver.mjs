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
//   the drain runs and its peak reported, with the CPU time the process
//   spent. The pool is warmed (poolMax connections opened) before work()
//   starts, as the Go side's pool and a running service's are.
//   trace: true (for profiling by hand) also prints to stderr when each
//   slot's first handler ran, handler starts per 100 ms, and the count and
//   durations of the pool's statements.
// steady: { consumer, slots, handlerMs, applicationName, gather }
//   work() over slots slots of consumer (subscribed by the Go side) while
//   the Go side sends at a steady rate, until stdin closes. Prints
//   {"ready": true} once the worker owns every slot; then, as each
//   handler starts, a line "<seq> <latency ms>" (payloads {seq, sent_ns}:
//   the steady suite's; latency against the wall clock); the handler then
//   sleeps handlerMs. At the end: {"handled": n, "errors": n}.
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
  // A warm pool, as the Go side's and a running service's: opening
  // connections is not part of the drain.
  const conns = await Promise.all(Array.from({ length: cfg.poolMax ?? 10 }, () => pool.connect()));
  for (const c of conns) c.release();
  const errors = [];
  const trace = [];
  const called = performance.now();
  const slotFirst = new Map();
  let inflight = 0;
  const worker = await pgque.work(pool, {
    queue: cfg.queue,
    consumer: cfg.consumer,
    slots: cfg.slots,
    concurrency: cfg.concurrency,
    onError: (err) => { errors.push(String(err && err.stack ? err.stack : err)); },
  }, async (msg) => {
    if (cfg.trace) {
      trace.push([performance.now(), msg.slot, inflight++]);
      if (!slotFirst.has(msg.slot)) slotFirst.set(msg.slot, Math.round(performance.now() - called));
    }
    const { t, s } = msg.payload;
    if (busy.has(t) || s !== (last.get(t) ?? 0) + 1) violations++;
    busy.add(t);
    last.set(t, s);
    if (first === null) first = performance.now();
    try {
      if (cfg.handlerMs > 0) await sleep(cfg.handlerMs);
    } finally {
      busy.delete(t);
      inflight--;
    }
    lastEnd = performance.now();
    if (++handled >= cfg.events) finished(true);
  });
  const timeout = setTimeout(() => finished(false), cfg.timeoutMs);
  const cpu0 = process.cpuUsage();
  const complete = await allDone;
  const cpu = process.cpuUsage(cpu0);
  clearTimeout(timeout);
  rssPeak = Math.max(rssPeak, process.memoryUsage.rss());
  clearInterval(sampler);
  await worker.stop({ timeoutMs: 10000 });
  if (!complete) fail(`only ${handled} of ${cfg.events} events handled within ${cfg.timeoutMs} ms; errors: ${errors.slice(0, 3).join('; ')}`);
  if (cfg.trace) {
    const buckets = new Map();
    for (const [at, , n] of trace) {
      const b = Math.floor((at - first) / 100);
      const v = buckets.get(b) ?? [0, 0];
      buckets.set(b, [v[0] + 1, Math.max(v[1], n)]);
    }
    process.stderr.write(`first handler call per slot, ms after work(): ${JSON.stringify([...slotFirst].sort((a, b) => a[0] - b[0]))}\n`);
    process.stderr.write([...buckets].map(([b, [c, n]]) => `${b * 100}ms: ${c} starts, max inflight ${n}`).join('\n') + '\n');
  }
  out({ handled, work_ms: lastEnd - first, order_violations: violations, rss_peak: rssPeak, cpu_ms: (cpu.user + cpu.system) / 1000, errors: errors.length });
}

async function steady(pool) {
  const errors = [];
  let handled = 0;
  const lines = [];
  let flushing = false;
  const flush = () => {
    flushing = false;
    if (lines.length > 0) process.stdout.write(lines.join('\n') + '\n');
    lines.length = 0;
  };
  const worker = await pgque.work(pool, {
    queue: cfg.queue,
    consumer: cfg.consumer,
    slots: cfg.slots,
    gatherReceives: cfg.gather === true,
    onError: (err) => { errors.push(String(err && err.stack ? err.stack : err)); },
  }, async (msg) => {
    const at = performance.timeOrigin + performance.now();
    lines.push(`${msg.payload.seq} ${(at - msg.payload.sent_ns / 1e6).toFixed(3)}`);
    if (!flushing) { flushing = true; setImmediate(flush); }
    handled++;
    if (cfg.handlerMs > 0) await sleep(cfg.handlerMs);
  });
  const stdinClosed = new Promise((resolve) => { process.stdin.on('end', resolve); process.stdin.on('close', resolve); });
  process.stdin.resume();
  while (worker.ownedSlots().length < cfg.slots) {
    if (await Promise.race([stdinClosed.then(() => true), sleep(20).then(() => false)])) break;
  }
  out({ ready: worker.ownedSlots().length === cfg.slots });
  await stdinClosed;
  await worker.stop({ timeoutMs: 10000 });
  flush();
  out({ handled, errors: errors.length, first_error: errors[0] ?? '' });
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

const pool = new pg.Pool({ ...cfg.connection, max: cfg.poolMax ?? 10, application_name: cfg.applicationName });
const qstats = new Map();
if (cfg.trace) {
  const orig = pg.Pool.prototype.query;
  pool.query = function (text, ...rest) {
    const t0 = performance.now();
    const name = String(typeof text === 'string' ? text : text.text).replace(/\s+/g, ' ').slice(0, 48);
    const p = orig.call(this, text, ...rest);
    const rec = () => {
      const v = qstats.get(name) ?? { n: 0, ms: 0, max: 0, first: [] };
      const d = performance.now() - t0;
      v.n++; v.ms += d; v.max = Math.max(v.max, d);
      if (v.first.length < 3) v.first.push(Math.round(d));
      qstats.set(name, v);
    };
    p.then(rec, rec);
    return p;
  };
  process.on('exit', () => {
    for (const [k, v] of qstats) process.stderr.write(`${v.n}x avg ${(v.ms / v.n).toFixed(1)}ms max ${v.max.toFixed(0)} first ${v.first} ${k}\n`);
  });
}
try {
  await { work, steady, send, sendBatch }[cfg.mode](pool);
  await pool.end();
  process.exit(0);
} catch (err) {
  fail(String(err && err.stack ? err.stack : err));
}
