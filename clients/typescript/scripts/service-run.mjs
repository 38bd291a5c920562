// A service's day, in one process: what a user of the package runs, with
// the checks a user would want.
//
//   npm run build && node scripts/service-run.mjs
//
// Starts a throwaway PostgreSQL (test/cluster.ts, as the tests do) with the
// three logins of docs/typescript.md ("Roles"): the owner migrates and
// creates the queue, the ticker login runs the package's Ticker, the
// application's login sends and works. Two work() pools of 16 slots with
// failure policy pause; handlers take 5–50 ms; 600 tenants, 4 of them hot
// (a fifth of the events); sends one by one on the pool, at RATE events/s
// for DURATION_S seconds. Unless told otherwise it holds a REPEATABLE READ
// transaction open for the whole run (the horizon a long report would
// hold), fails 1% of first attempts, and stops one pool gracefully a third
// of the way in and starts another in its place at 60%.
//
// It checks, per tenant, that events were handled in order, none twice and
// none lost, and no two at once; and prints the latency from the send's
// commit to the handler's start (hot and other tenants, and the other
// tenants' p99 per 5 s), how long the stopped pool's slots went unworked,
// and the dead tuples of pgque's tables at the end.
//
// Environment: RATE (400), DURATION_S (60), FAIL (0.01), STOP (1; 0 keeps
// both pools), HOLD (1; 0 holds no horizon), DIST (another build's dist
// directory, to compare two builds).
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { createRequire } from "node:module";

const env = (name, dflt) => (process.env[name] === undefined ? dflt : Number(process.env[name]));
const RATE = env("RATE", 400), DURATION_S = env("DURATION_S", 60), FAIL = env("FAIL", 0.01);
const STOP = env("STOP", 1) !== 0, HOLD = env("HOLD", 1) !== 0;
const TENANTS = 600, HOT = 4, HOT_SHARE = 0.2, SLOTS = 16;

const dist = path.resolve(process.env.DIST ?? path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "dist"));
const { startCluster } = await import(pathToFileURL(path.join(dist, "test", "cluster.js")).href);
const pgque = await import(pathToFileURL(path.join(dist, "src", "index.js")).href);
const pg = createRequire(path.join(dist, "src", "index.js"))("pg");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const quantile = (xs, p) => {
  if (xs.length === 0) return "-";
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
};

const cluster = await startCluster();
const pools = [];
const poolAs = (user, max) => {
  const u = new URL(cluster.url("files"));
  if (user) u.username = user;
  const p = new pg.Pool({ connectionString: u.toString(), max });
  pools.push(p);
  return p;
};
try {
  const sup = new pg.Pool({ connectionString: cluster.url("postgres"), max: 1 });
  for (const s of [
    "create role pgque_writer nologin", "create role pgque_reader nologin", "create role pgque_admin nologin",
    "create role files_owner login", "create role files_app login in role pgque_writer, pgque_reader",
    "create role files_ticker login in role pgque_admin", "create database files owner files_owner",
  ]) await sup.query(s);
  await sup.end();
  const owner = poolAs("files_owner", 2);
  await pgque.migrate(owner);
  await owner.query("select pgque.create_queue('files')");
  const app = poolAs("files_app", 40);
  const ticker = new pgque.Ticker(poolAs("files_ticker", 4), { onError: (e) => console.error("ticker:", e.message) });
  await ticker.start();

  const holder = new pg.Client({ connectionString: cluster.url("files") });
  await holder.connect();
  if (HOLD) {
    await holder.query("begin isolation level repeatable read");
    await holder.query("select count(*) from pg_class");
  }

  const last = new Map(); // tenant -> last sequence number handled
  const running = new Set();
  let handled = 0, twice = 0, skipped = 0, overlap = 0, injected = 0, errors = 0;
  const latency = { hot: [], other: [] };
  const windows = [];
  let t0 = Date.now();
  const handler = async (msg) => {
    const { t, s } = msg.payload;
    const created = msg.createdAt.getTime();
    if (msg.retryCount === 0) {
      const l = Date.now() - created;
      if (t < HOT) latency.hot.push(l);
      else {
        latency.other.push(l);
        (windows[Math.floor((created - t0) / 5000)] ??= []).push(l);
      }
    }
    if (running.has(t)) overlap++;
    running.add(t);
    try {
      await sleep(5 + Math.random() * 45);
      if (msg.retryCount === 0 && Math.random() < FAIL) {
        injected++;
        throw new Error("injected failure");
      }
      const prev = last.get(t) ?? 0;
      if (s <= prev) twice++;
      else if (s !== prev + 1) skipped++;
      last.set(t, Math.max(prev, s));
      handled++;
    } finally {
      running.delete(t);
    }
  };
  let stoppedAt = 0, unworkedUntil = 0, unworked = new Set();
  const options = (workerId) => ({
    queue: "files", consumer: "indexer", slots: SLOTS, failurePolicy: "pause", workerId,
    retryDelayMs: () => 200,
    onError: (e) => { errors++; console.error(workerId, e.message); },
    onSlot: (c) => {
      if (c.kind === "claimed" && unworked.delete(c.slot) && unworked.size === 0) unworkedUntil = Date.now();
    },
  });
  const a = await pgque.work(app, options("a"), handler);
  let b = await pgque.work(app, options("b"), handler);
  let replaced = false;

  const seq = new Array(TENANTS).fill(0);
  let sent = 0, sendErrors = 0;
  const sends = [];
  t0 = Date.now();
  while (Date.now() - t0 < DURATION_S * 1000) {
    const el = (Date.now() - t0) / 1000;
    if (STOP && el > DURATION_S / 3 && b && !stoppedAt) {
      unworked = new Set(b.ownedSlots());
      stoppedAt = Date.now();
      const stopping = b;
      b = null;
      void stopping.stop({ timeoutMs: 10_000 });
    }
    if (STOP && el > DURATION_S * 0.6 && !b && !replaced) {
      replaced = true;
      b = await pgque.work(app, options("b2"), handler);
    }
    for (let due = Math.floor(el * RATE) - sent; due > 0; due--) {
      const t = Math.random() < HOT_SHARE ? Math.floor(Math.random() * HOT) : HOT + Math.floor(Math.random() * (TENANTS - HOT));
      const s = ++seq[t];
      sent++;
      sends.push(pgque.send(app, "files", { type: "FileCreated", payload: { t, s }, partitionKey: `tenant-${t}` })
        .catch((e) => { sendErrors++; console.error("send:", e.message); }));
    }
    await sleep(10);
  }
  await Promise.all(sends);
  const produced = Date.now();
  while (handled < sent && Date.now() - produced < 120_000) await sleep(50);
  let behind = 0;
  for (let t = 0; t < TENANTS; t++) if ((last.get(t) ?? 0) !== seq[t]) behind++;

  console.log(`pgque service run: ${RATE} events/s for ${DURATION_S} s, ${TENANTS} tenants (${HOT} hot, ${HOT_SHARE * 100}% of events), ` +
    `handlers 5-50 ms, ${FAIL * 100}% of first attempts fail, policy pause, 2 pools x ${SLOTS} slots` +
    `${HOLD ? ", a REPEATABLE READ horizon held throughout" : ""}${STOP ? ", one pool stopped at 1/3 and replaced at 60%" : ""}`);
  console.log(`  sent ${sent} (${sendErrors} send errors), handled ${handled}; the last send's events were all handled ${Date.now() - produced} ms after it`);
  console.log(`  per tenant: ${twice} handled twice, ${skipped} out of order, ${overlap} overlapping, ${behind} tenants not at their last event`);
  console.log(`  ${injected} injected failures, ${errors} worker errors`);
  console.log(`  latency, send commit to handler start: hot tenants p50 ${quantile(latency.hot, 0.5)} p99 ${quantile(latency.hot, 0.99)} ` +
    `max ${quantile(latency.hot, 1)} ms; others p50 ${quantile(latency.other, 0.5)} p99 ${quantile(latency.other, 0.99)} max ${quantile(latency.other, 1)} ms`);
  console.log(`  others' p99 per 5 s: ${windows.map((w) => quantile(w ?? [], 0.99)).join(" ")}`);
  if (stoppedAt) {
    console.log(unworkedUntil ? `  the stopped pool's slots were all claimed by the other ${unworkedUntil - stoppedAt} ms after stop() was called`
      : `  ${unworked.size} of the stopped pool's slots were never claimed again`);
  }
  const dead = await owner.query(`select relname, n_dead_tup from pg_stat_user_tables
    where schemaname = 'pgque' and n_dead_tup > 0 order by n_dead_tup desc limit 6`).catch(() => ({ rows: [] }));
  console.log(`  dead tuples: ${dead.rows.map((r) => `${r.relname} ${r.n_dead_tup}`).join(", ") || "none"}`);
  const ok = twice === 0 && skipped === 0 && overlap === 0 && behind === 0;
  console.log(ok ? "PASSED" : "FAILED");
  process.exitCode = ok ? 0 : 1;

  await holder.query("rollback").catch(() => {});
  await holder.end();
  await a.stop();
  if (b) await b.stop();
  await ticker.stop();
} finally {
  await Promise.all(pools.map((p) => p.end().catch(() => {})));
  cluster.stop();
}
