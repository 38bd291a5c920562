// pg-boss driver for pgque's peers benchmark (internal/bench, suite peers).
//
// It runs the per-tenant ordered workload with pg-boss's key_strict_fifo
// policy (FIFO per singletonKey; a key's later jobs wait while one is
// active) and prints one JSON line of results. The Go side starts it with
//
//   node driver.mjs '<json config>'
//
// config: { connection: {host, port, user, password, database},
//           events, tenants, workers, batchSize, handlerMs, timeoutMs,
//           mode?, callers?, boss?, work? }
// (boss and work, when given, override the PgBoss constructor's and
// work()'s options below, to try other settings by hand.)
//
// Phases: (1) load `events` jobs, one per tenant per round, round after
// round, each round one insert() so created_on orders a tenant's jobs;
// (2) timed: `workers` local workers (localConcurrency) drain the queue,
// each fetching up to batchSize jobs and running them one after another,
// fetching again at once while its batches come back full
// (burstWhenBatchFull) and polling every 0.5 s, pg-boss's minimum,
// otherwise: the queue notifies on insert only, so the default 30 s
// notify backstop would leave idle workers asleep through the drain. Each
// job's handler checks that its tenant's jobs arrive in order and sleeps
// handlerMs. The drain has a time budget (timeoutMs); past it the driver
// reports what was handled so far (timed_out: true). The resident set size
// of the process is sampled every 20 ms during the drain; its peak is
// reported (rss_peak).
//
// mode "send" instead times `events` single send() calls, each with its
// tenant's singletonKey, made by `callers` concurrent loops (or, with
// batch > 0, insert() calls of `batch` jobs, one per tenant per call, one
// call after another), and prints { events, ms }.
import { PgBoss } from 'pg-boss';

const cfg = JSON.parse(process.argv[2]);
const queue = 'bench';
const startAll = performance.now();

const boss = new PgBoss({
  ...cfg.connection,
  schema: 'pgboss',
  max: cfg.workers + 4,
  schedule: false,
  supervise: false,
  useListenNotify: true,
  ...(cfg.boss ?? {}),
});
let bossError = null;
boss.on('error', (err) => { bossError = bossError ?? err; });

function fail(msg) {
  process.stdout.write(JSON.stringify({ error: msg }) + '\n');
  process.exit(1);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

try {
  await boss.start();
  await boss.createQueue(queue, { policy: 'key_strict_fifo', notify: true, retryLimit: 0 });

  if (cfg.mode === 'send') {
    let next = 0;
    const start = performance.now();
    for (let from = 0; cfg.batch > 0 && from < cfg.events; from += cfg.batch) {
      const jobs = [];
      for (let i = from; i < Math.min(from + cfg.batch, cfg.events); i++) {
        const t = i % cfg.tenants;
        jobs.push({ data: { t, r: Math.floor(i / cfg.tenants) }, singletonKey: 'tenant-' + t });
      }
      await boss.insert(queue, jobs);
      next = cfg.events;
    }
    await Promise.all(Array.from({ length: cfg.callers }, async () => {
      for (let i = next++; i < cfg.events; i = next++) {
        const t = i % cfg.tenants;
        const id = await boss.send(queue, { t, r: Math.floor(i / cfg.tenants) }, { singletonKey: 'tenant-' + t });
        if (!id) throw new Error(`send of job ${i} returned no id`);
      }
    }));
    const ms = performance.now() - start;
    await boss.stop({ graceful: false, close: true, timeout: 2000 });
    if (bossError) fail('pg-boss error: ' + (bossError.stack ?? bossError));
    process.stdout.write(JSON.stringify({ events: cfg.events, ms }) + '\n');
    process.exit(0);
  }

  const rounds = Math.ceil(cfg.events / cfg.tenants);
  let loaded = 0;
  const loadStart = performance.now();
  for (let r = 0; r < rounds && loaded < cfg.events; r++) {
    const jobs = [];
    for (let t = 0; t < cfg.tenants && loaded < cfg.events; t++, loaded++) {
      jobs.push({ data: { t, r }, singletonKey: 'tenant-' + t });
    }
    await boss.insert(queue, jobs);
  }
  const loadMs = performance.now() - loadStart;

  const last = new Map();
  let done = 0;
  let violations = 0;
  let finished;
  const allDone = new Promise((resolve) => { finished = resolve; });
  const workStart = performance.now();
  let rssPeak = 0;
  const sampler = setInterval(() => { rssPeak = Math.max(rssPeak, process.memoryUsage.rss()); }, 20);
  let firstMs = null;
  const handle = async (job) => {
    const { t, r } = job.data;
    const prev = last.has(t) ? last.get(t) : -1;
    if (r !== prev + 1) violations++;
    last.set(t, r);
    if (cfg.handlerMs > 0) await sleep(cfg.handlerMs);
    done++;
  };
  await boss.work(queue, {
    localConcurrency: cfg.workers,
    batchSize: cfg.batchSize,
    pollingIntervalSeconds: 0.5,
    notifyPollingIntervalSeconds: 0.5,
    burstWhenBatchFull: true,
    ...(cfg.work ?? {}),
  }, async (jobs) => {
    if (firstMs === null) firstMs = performance.now() - workStart;
    for (const job of jobs) await handle(job);
    if (done >= cfg.events) finished();
  });
  // A time budget rather than a failure: pg-boss slows down as its backlog
  // grows, and what it handled within the budget is its measured rate.
  let timedOut = false;
  const timeout = setTimeout(() => { timedOut = true; finished(); }, cfg.timeoutMs ?? 600000);
  await allDone;
  clearTimeout(timeout);
  const workMs = performance.now() - workStart;
  rssPeak = Math.max(rssPeak, process.memoryUsage.rss());
  clearInterval(sampler);
  const handled = done;
  await boss.stop({ graceful: false, close: true, timeout: 2000 });
  if (bossError) fail('pg-boss error: ' + (bossError.stack ?? bossError));
  if (handled === 0) fail(`no job handled within ${cfg.timeoutMs} ms`);
  process.stdout.write(JSON.stringify({
    events: cfg.events, handled, timed_out: timedOut, load_ms: loadMs, work_ms: workMs, first_ms: firstMs,
    order_violations: violations, rss_peak: rssPeak, total_ms: performance.now() - startAll,
  }) + '\n');
  process.exit(0);
} catch (err) {
  fail(String(err && err.stack ? err.stack : err));
}
