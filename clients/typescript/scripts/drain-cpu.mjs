// The TypeScript worker's CPU per event, drain after drain in one process.
//
//   npm run build && node scripts/drain-cpu.mjs [runs] [dist]
//
// Starts a throwaway PostgreSQL (test/cluster.ts, as the tests do), then
// `runs` times (default 4): loads 20 000 events of 1000 tenants in 20
// ticks into a new queue, and drains them with work() over 8 slots and a
// handler that only checks each tenant's order. Prints each drain's
// events/s and the process's CPU per event from work() resolving to the
// last handler. The first drain runs code not yet optimised, as the bench's
// ts suite does in its fresh process; the later ones show the warm worker.
// With PGQUE_DRAIN_SIGNAL=1 the handler reads its signal.
// `dist` is another build's dist directory, to compare two builds.
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { createRequire } from "node:module";

const runs = Number(process.argv[2] ?? 4);
const dist = path.resolve(process.argv[3] ?? path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "dist"));
const { startCluster } = await import(pathToFileURL(path.join(dist, "test", "cluster.js")).href);
const pgque = await import(pathToFileURL(path.join(dist, "src", "index.js")).href);
const pg = createRequire(path.join(dist, "src", "index.js"))("pg");
const readSignal = process.env.PGQUE_DRAIN_SIGNAL === "1";

const EVENTS = 20_000, TENANTS = 1000, SLOTS = 8;
const cluster = await startCluster();
const admin = new pg.Pool({ connectionString: cluster.url("postgres"), max: 1 });
await admin.query("create database drain");
const pool = new pg.Pool({ connectionString: cluster.url("drain"), max: SLOTS + 4 });
try {
  await pgque.migrate(pool);
  for (let run = 0; run < runs; run++) {
    const queue = `q${run}`;
    await pool.query("select pgque.create_queue($1)", [queue]);
    await pgque.subscribeSlots(pool, queue, "c", SLOTS);
    for (let from = 0; from < EVENTS; from += 1000) {
      const events = [];
      for (let i = from; i < from + 1000; i++) {
        events.push({ type: "FileCreated", payload: { t: i % TENANTS, s: Math.floor(i / TENANTS) + 1 }, partitionKey: `tenant-${i % TENANTS}` });
      }
      await pgque.sendBatch(pool, queue, events);
      const c = await pool.connect();
      try {
        await c.query("begin");
        await c.query("select pgque.force_next_tick($1)", [queue]);
        await c.query("select pgque.ticker($1)", [queue]);
        await c.query("commit");
      } finally {
        c.release();
      }
    }
    const last = new Map();
    let handled = 0, wrong = 0, first = 0, end = 0;
    let drained;
    const done = new Promise((resolve) => (drained = resolve));
    const worker = await pgque.work(pool, { queue, consumer: "c", slots: SLOTS }, async (msg, ctx) => {
      if (readSignal && ctx.signal.aborted) wrong++;
      const { t, s } = msg.payload;
      if (s !== (last.get(t) ?? 0) + 1) wrong++;
      last.set(t, s);
      first ||= performance.now();
      end = performance.now();
      if (++handled === EVENTS) drained();
    });
    const cpu0 = process.cpuUsage();
    await done;
    const cpu = process.cpuUsage(cpu0);
    await worker.stop({ timeoutMs: 10_000 });
    console.log(`drain ${run}: ${Math.round(EVENTS / ((end - first) / 1000))} events/s, ${((cpu.user + cpu.system) / EVENTS).toFixed(1)} µs CPU/event${wrong ? `, ${wrong} out of order` : ""}`);
    if (wrong) process.exitCode = 1;
  }
} finally {
  await pool.end();
  await admin.end();
  cluster.stop();
}
