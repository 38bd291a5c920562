// Stopping and losing workers: a graceful stop finishes and acknowledges
// its chunk and releases its leases; a hard stop and a crash (SIGKILL of a
// worker process) acknowledge nothing, and another worker takes the slot
// over under the next epoch and receives the chunk again. Two workers of
// one consumer share its slots fairly.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { HandlersStillRunningError, LeaseLostError, work, workTx, WorkerKilledError, type Message, type SlotChange, type WorkOptions, type Worker } from "../src/index.js";
import { waitFor } from "./harness.js";
import { gate, sendKeyed, setup } from "./worker_helpers.js";

const fast: Partial<WorkOptions> = { claimIntervalMs: 100, pollIntervalMs: 50, retryDelayMs: () => 20, listen: false };
const here = path.dirname(fileURLToPath(import.meta.url));

/** Whether p settles within ms: a bound on a stop, never a wait for a condition. */
async function within(p: Promise<unknown>, ms: number): Promise<boolean> {
  let t: NodeJS.Timeout | undefined;
  const late = new Promise<boolean>((r) => (t = setTimeout(() => r(false), ms)));
  try {
    return await Promise.race([p.then(() => true), late]);
  } finally {
    clearTimeout(t);
  }
}

async function owner(db: { pool: import("pg").Pool }, slot = 0): Promise<{ owner: string | null; epoch: string }> {
  const { rows } = await db.pool.query("select owner, epoch::text from pgque.partition_slot_leases where slot = $1", [slot]);
  return rows[0];
}

test("stop() lets the handler in flight finish, acknowledges it and releases the lease", async (t) => {
  const db = await setup(t, "gs");
  const release = gate();
  const started = gate();
  const handled: string[] = [];
  const changes: SlotChange[] = [];
  const w1 = db.track(await work(db.pool, { ...fast, queue: "gs", consumer: "c", slots: 1, onSlot: (c) => changes.push(c) }, async (m: Message) => {
    started.open();
    await release.wait;
    handled.push(m.id);
  }));
  const [e0] = await sendKeyed(db.pool, "gs", ["k"], 1);
  await started.wait;
  let stopped = false;
  const stopping = w1.stop().then(() => (stopped = true));
  // Events sent after stop() are not fetched by the stopping worker.
  const [e1] = await sendKeyed(db.pool, "gs", ["k"], 1);
  assert.equal(stopped, false, "stop waits for the handler in flight");
  release.open();
  await stopping;
  assert.deepEqual(handled, [e0]);
  assert.equal((await owner(db)).owner, null, "the lease was released");
  const epoch = BigInt((await owner(db)).epoch);
  assert.deepEqual(changes, [
    { kind: "claimed", slot: 0, nslots: 1, epoch },
    { kind: "ended", slot: 0, nslots: 1, epoch, fenced: false },
  ], "onSlot saw the claim and the end of the slot's lease");
  // A new worker receives only what the first did not acknowledge.
  const next: Message[] = [];
  const got = gate();
  db.track(await work(db.pool, { ...fast, queue: "gs", consumer: "c", slots: 1 }, (m: Message) => {
    next.push(m);
    got.open();
  }));
  await got.wait;
  assert.deepEqual(next.map((m) => [m.id, m.retryCount]), [[e1, 0]]);
});

/**
 * Runs a worker on queue's one slot that handles keys hot, a, b, c and d
 * (10 events each, one chunk), blocks in hot's third event until stop() has
 * been called, and checks what stop() hands back: the handler running
 * finishes and is acknowledged, every event not started goes to the next
 * worker, in key order, and nothing runs twice.
 */
async function handsBack(t: { after(fn: () => Promise<void>): void }, queue: string, opts: Partial<WorkOptions>, heldFirst: boolean): Promise<void> {
  const db = await setup(t, queue);
  const release = gate();
  const blocked = gate();
  const first: Message<{ k: string; i: number }>[] = [];
  const w1 = db.track(await work(db.pool, { ...fast, queue, consumer: "c", slots: 1, ...opts }, async (m: Message<{ k: string; i: number }>) => {
    first.push(m);
    if (m.key === "hot" && m.payload.i === 2) {
      blocked.open();
      await release.wait;
    }
  }));
  const ids = await sendKeyed(db.pool, queue, ["hot", "a", "b", "c", "d"], 10);
  await blocked.wait;
  if (heldFirst) {
    await waitFor("hot's key to be held", async () =>
      (await db.pool.query("select 1 from pgque.key_heads($1, 'c') where key = 'hot' and state = 'held'", [queue])).rowCount === 1);
  }
  let stopped = false;
  // stop() stops the lanes before it returns its promise.
  const stopping = w1.stop().then(() => (stopped = true));
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(stopped, false, "stop waits for the handler running");
  release.open();
  await stopping;
  const hot = first.filter((m) => m.key === "hot").map((m) => m.payload.i);
  assert.deepEqual(hot, [0, 1, 2], "hot ran up to the event in its handler at the stop, no further");
  // The next worker gets what the first did not run, each key in order.
  const next: Message<{ k: string; i: number }>[] = [];
  const all = gate();
  db.track(await work(db.pool, { ...fast, queue, consumer: "c", slots: 1 }, (m: Message<{ k: string; i: number }>) => {
    next.push(m);
    if (first.length + next.length >= ids.length) all.open();
  }));
  await all.wait;
  const seen = [...first, ...next].map((m) => m.id).sort();
  assert.deepEqual(seen, [...ids].sort(), "every event ran exactly once");
  for (const k of ["hot", "a", "b", "c", "d"]) {
    const order = [...first, ...next].filter((m) => m.key === k).map((m) => m.payload.i);
    assert.deepEqual(order, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], `key ${k} in order`);
  }
  assert.ok(next.every((m) => m.key !== "hot" || m.payload.i > 2), "hot's first three did not run again");
}

test("stop() hands back the events its lanes have not started: lanes waiting for a place give theirs back at once", async (t) => {
  // One place: hot's lane has it from its first event, the other keys'
  // lanes wait for it and never start.
  await handsBack(t, "hb1", { concurrency: 1 }, false);
});

test("stop() hands back the rest of a held key's events: the hot lane held past its chunk stops after its running event", async (t) => {
  // The other keys finish at once; hot's lane, in one handler for longer
  // than holdAfterMs, is held and the chunk acknowledged before the stop.
  await handsBack(t, "hb2", { holdAfterMs: 5 }, true);
});

test("kill() aborts the signal of a handler that reads it only after the kill", async (t) => {
  const db = await setup(t, "hsl");
  const started = gate();
  const killed = gate();
  let reason: unknown;
  const w = db.track(await work(db.pool, { ...fast, queue: "hsl", consumer: "c", slots: 1 }, async (_m, ctx) => {
    started.open();
    await killed.wait;
    // The call's signal is made here, after the slot was aborted.
    reason = ctx.signal.aborted ? ctx.signal.reason : "not aborted";
  }));
  await sendKeyed(db.pool, "hsl", ["k"], 1);
  await started.wait;
  const stopping = w.kill();
  killed.open();
  await stopping;
  assert.ok(reason instanceof WorkerKilledError, `read ${String(reason)}`);
});

test("kill() aborts the handlers and acknowledges nothing; another worker takes over under the next epoch", async (t) => {
  const db = await setup(t, "hs");
  const started = gate();
  let reason: unknown;
  const w1 = db.track(await work(db.pool, { ...fast, queue: "hs", consumer: "c", slots: 1, leaseTtlMs: 1500 }, async (_m, { signal }) => {
    started.open();
    await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
    reason = signal.reason;
  }));
  const [e0] = await sendKeyed(db.pool, "hs", ["k"], 1);
  await started.wait;
  const before = await owner(db);
  await w1.kill();
  assert.ok(reason instanceof WorkerKilledError, `aborted with ${String(reason)}`);
  assert.equal((await owner(db)).owner, w1.workerId, "a hard stop does not release the lease");
  const got = gate();
  const next: Message[] = [];
  const changes: SlotChange[] = [];
  db.track(await work(db.pool, { ...fast, queue: "hs", consumer: "c", slots: 1, leaseTtlMs: 1500, onSlot: (c) => changes.push(c) }, (m: Message) => {
    next.push(m);
    got.open();
  }));
  await got.wait;
  assert.equal(next[0]!.id, e0);
  assert.equal(next[0]!.epoch, BigInt(before.epoch) + 1n);
  assert.deepEqual(changes, [{ kind: "claimed", slot: 0, nslots: 1, epoch: BigInt(before.epoch) + 1n }],
    "onSlot saw the takeover's claim under the next epoch");
});

/**
 * Starts worker_child.js on queue (consumer "c"; mode "listen" binds its
 * lease to its LISTEN session), sends keys × n events once it subscribed
 * (a new consumer reads only what is sent after that), waits until it is
 * in the middle of its chunk and kills it with SIGKILL. Returns the ids
 * sent and the epoch the child held.
 */
async function killedMidChunk(t: { after(fn: () => void): void }, db: Awaited<ReturnType<typeof setup>>, queue: string, keys: string[], n: number,
  mode?: "listen"): Promise<{ ids: string[]; childEpoch: bigint }> {
  const child = spawn(process.execPath, [path.join(here, "worker_child.js"), db.url, queue, "c", ...(mode ? [mode] : [])],
    { stdio: ["ignore", "pipe", "inherit"] });
  t.after(() => {
    if (child.exitCode === null) child.kill("SIGKILL");
  });
  const lines = createInterface({ input: child.stdout! });
  let ids: string[] = [];
  const first = await new Promise<string>((resolve, reject) => {
    lines.on("line", (l) => {
      if (l === "started") void sendKeyed(db.pool, queue, keys, n).then((x) => (ids = x), reject);
      if (l.startsWith("handling ")) resolve(l);
    });
    child.on("exit", (code) => reject(new Error(`the worker process exited (${code}) before handling`)));
  });
  await waitFor("the sends to commit", () => ids.length === keys.length * n);
  if (mode === "listen") {
    await waitFor("the lease bound to the worker's LISTEN session", async () =>
      (await db.pool.query("select sl_session is not null as bound from pgque.slot_lease")).rows[0]?.bound === true, 10_000);
  }
  const exited = new Promise((r) => child.on("exit", r));
  child.kill("SIGKILL");
  await exited;
  return { ids, childEpoch: BigInt(first.split(" ")[2]!) };
}

test("a worker process killed with SIGKILL mid-chunk: the survivor takes the slot over and handles the chunk again", async (t) => {
  const db = await setup(t, "crash");
  const { ids, childEpoch } = await killedMidChunk(t, db, "crash", ["k", "o"], 2);
  const seen: Message[] = [];
  const all = gate();
  db.track(await work(db.pool, { ...fast, queue: "crash", consumer: "c", slots: 1, leaseTtlMs: 2000 }, (m: Message) => {
    seen.push(m);
    if (seen.length === ids.length) all.open();
  }));
  await all.wait;
  // Everything the dead worker received comes again, in order per key,
  // under the next epoch, and not as a retry.
  assert.deepEqual(seen.map((m) => m.id).sort(), [...ids].sort());
  assert.deepEqual(seen.filter((m) => m.key === "k").map((m) => m.id), [ids[0], ids[2]]);
  for (const m of seen) {
    assert.equal(m.epoch, childEpoch + 1n);
    assert.equal(m.retryCount, 0);
  }
});

test("a worker process killed with SIGKILL whose lease is bound to its LISTEN session: taken over long before the 30 s TTL", async (t) => {
  const db = await setup(t, "crashb");
  const { ids, childEpoch } = await killedMidChunk(t, db, "crashb", ["k"], 2, "listen");
  const killedAt = Date.now();
  const seen: Message[] = [];
  const all = gate();
  // The survivor has the default 30 s lease TTL too.
  db.track(await work(db.pool, { queue: "crashb", consumer: "c", slots: 1, claimIntervalMs: 100, pollIntervalMs: 50 }, (m: Message) => {
    seen.push(m);
    if (seen.length === ids.length) all.open();
  }));
  await all.wait;
  const took = Date.now() - killedAt;
  assert.ok(took < 15_000, `the survivor took the slot over ${took} ms after the kill, want well before the 30 s TTL`);
  assert.deepEqual(seen.map((m) => m.id), ids, "the dead worker's chunk comes again, in order");
  for (const m of seen) assert.equal(m.epoch, childEpoch + 1n);
});

test("a LISTEN session that breaks under a live worker: its leases are bound to the new session in time, no slot is fenced", async (t) => {
  const db = await setup(t, "rebind");
  const errors: unknown[] = [];
  const seen: string[] = [];
  db.track(await work(db.pool, { queue: "rebind", consumer: "c", slots: 2, claimIntervalMs: 100, pollIntervalMs: 50, onError: (e) => errors.push(e) },
    (m: Message) => {
      seen.push(m.id);
    }));
  const sessions = async () =>
    (await db.pool.query<{ s: number | null }>("select sl_session as s from pgque.slot_lease where sl_owner is not null")).rows.map((r) => r.s);
  let pid = 0;
  await waitFor("both leases bound to one session", async () => {
    const s = await sessions();
    if (s.length !== 2 || s[0] === null || s[0] !== s[1]) return false;
    pid = s[0];
    return true;
  });
  await db.pool.query("select pg_terminate_backend($1)", [pid]);
  await waitFor("both leases bound to the new session", async () => {
    const s = await sessions();
    return s.length === 2 && s.every((x) => x !== null && x !== pid);
  }, 30_000 / 8);
  const ids = await sendKeyed(db.pool, "rebind", ["a", "b", "c"], 3);
  await waitFor("the events sent after the reconnect", () => seen.length === ids.length);
  assert.deepEqual(errors.filter((e) => e instanceof LeaseLostError), [], "no slot was fenced");
});

test("two workers of one consumer converge to a fair share of its slots", async (t) => {
  const db = await setup(t, "fair");
  const opts = { ...fast, queue: "fair", consumer: "c", slots: 6 };
  const w1 = db.track(await work(db.pool, opts, () => {}));
  await waitFor("the first worker to hold all 6 slots", () => w1.ownedSlots().length === 6);
  const w2 = db.track(await work(db.pool, { ...opts, onError: (e) => console.log("w2 err", String(e)), onSlot: (c) => console.log(Date.now() % 100000, "w2", c.kind, c.slot) }, () => {}));
  await waitFor("3 slots each", () => w1.ownedSlots().length === 3 && w2.ownedSlots().length === 3, 15_000);
  await w2.stop();
  await waitFor("the first worker to take the released slots back", () => w1.ownedSlots().length === 6, 15_000);
});

test("a worker that stops gracefully announces last that it left: no slots, not hungry", async (t) => {
  const db = await setup(t, "leave");
  const w = db.track(await work(db.pool, { ...fast, queue: "leave", consumer: "c", slots: 2 }, () => {}));
  await waitFor("both slots", () => w.ownedSlots().length === 2);
  await w.stop();
  // Its peers (Go pools too: internal/workerpool, left) then stop counting
  // it at once and take its slots on their next pass.
  const { rows } = await db.pool.query(`select p.wp_hungry as hungry, cardinality(p.wp_slots) as slots
    from pgque.worker_presence p join pgque.queue q on q.queue_id = p.wp_queue
    where q.queue_name = 'leave' and p.wp_consumer = 'c' order by p.wp_seen desc limit 1`);
  assert.deepEqual(rows, [{ hungry: false, slots: 0 }]);
});

test("a stop does not wait for its last announcement when the server holds it: bounded at 2 s, and said before it resolves", async (t) => {
  const db = await setup(t, "leavelock");
  const errors: unknown[] = [];
  // One claim pass only (the next is a minute away): none runs under the lock.
  const w = db.track(await work(db.pool, { queue: "leavelock", consumer: "c", slots: 2, claimIntervalMs: 60_000, listen: false, onError: (e) => errors.push(e) }, () => {}));
  await waitFor("both slots", () => w.ownedSlots().length === 2);
  const locker = await db.pool.connect();
  try {
    await locker.query("begin");
    await locker.query("lock table pgque.worker_presence in access exclusive mode");
    const t0 = performance.now();
    assert.ok(await within(w.stop(), 6000), "stop() resolves while the announcement waits for the lock");
    const took = performance.now() - t0;
    assert.ok(took >= 1900, `stop() took ${took} ms: the announcement was not waited for at all`);
    const said = errors.map(String);
    assert.ok(said.some((m) => m.includes("did not finish within 2000 ms")), `stop() resolved without saying its announcement was cut short: ${said.join("; ")}`);
    // The announcement then fails: stop() has resolved, so that is not
    // reported any more (the caller may have moved on, or exited).
    const released = new Promise((r) => db.pool.once("release", r));
    // Asked of pg_locks, not of the wait event, which a waiting backend
    // clears for an instant whenever its latch wakes it.
    const { rows } = await locker.query(`select pg_cancel_backend(a.pid) as ok from pg_stat_activity a
      where a.datname = current_database() and a.query like '%pgque.announce_worker(%'
        and exists (select 1 from pg_locks l where l.pid = a.pid and not l.granted)`);
    assert.deepEqual(rows, [{ ok: true }], "the announcement waits on the lock");
    await released;
    await new Promise((r) => setImmediate(r));
    assert.equal(errors.length, said.length, `reported after stop() resolved: ${errors.slice(said.length).map(String).join("; ")}`);
  } finally {
    await locker.query("rollback");
    locker.release();
  }
});

test("a worker that stops gracefully is replaced at once: its peer takes its slots in a pass its NOTIFY starts", async (t) => {
  const db = await setup(t, "leave2");
  // Claim passes 8 s apart (6.4 at least, with their jitter). Before, the
  // survivor counted the stopped worker as live for three intervals and
  // took a slot beyond its share only once it had stayed free a whole
  // pass: its second pass after the stop, 12.8 s or more. The bound below
  // leaves room for a loaded machine.
  const opts = { queue: "leave2", consumer: "c", slots: 6, claimIntervalMs: 8_000, pollIntervalMs: 50 };
  const w1 = db.track(await work(db.pool, opts, () => {}));
  await waitFor("the first worker to hold all 6 slots", () => w1.ownedSlots().length === 6);
  const w2 = db.track(await work(db.pool, opts, () => {}));
  await waitFor("3 slots each", () => w1.ownedSlots().length === 3 && w2.ownedSlots().length === 3, 30_000);
  await w2.stop();
  await waitFor("the first worker to take the slots w2 released", () => w1.ownedSlots().length === 6, 10_000);
});

/**
 * A worker of a one-slot consumer of queue whose handler ignores its signal
 * until never opens, and the id of the event it is stuck in.
 */
async function stuckWorker(db: Awaited<ReturnType<typeof setup>>, queue: string, opts: Partial<WorkOptions>) {
  const started = gate();
  const never = gate();
  const errors: unknown[] = [];
  const w = db.track(await work(db.pool, { ...fast, queue, consumer: "c", slots: 1, onError: (e) => errors.push(e), ...opts }, async () => {
    started.open();
    await never.wait;
  }));
  const [e0] = await sendKeyed(db.pool, queue, ["k"], 1);
  await started.wait;
  return { w, e0: e0!, errors, never };
}

/**
 * Asserts that stopping (what stops w) resolves within 3 s although the
 * handler ignores its signal, and names that handler's event to onError.
 */
async function assertGivesUp(what: string, stopping: Promise<void>, w: Worker, errors: unknown[], e0: string): Promise<HandlersStillRunningError> {
  const t0 = performance.now();
  assert.ok(await within(stopping, 5000), `${what} resolves within 5 s while the handler ignores its signal`);
  const elapsed = performance.now() - t0;
  assert.ok(elapsed < 3000, `${what} took ${elapsed} ms`);
  const gaveUp = errors.filter((e) => e instanceof HandlersStillRunningError);
  assert.equal(gaveUp.length, 1, `onError saw ${errors.map(String).join("; ")}`);
  assert.deepEqual(gaveUp[0]!.running, [{ slot: 0, eventId: e0 }]);
  assert.equal(w.stats().running, 1, "the abandoned handler still runs");
  return gaveUp[0]!;
}

test("stop({ timeoutMs }) gives up on a handler that ignores its signal, names its event to onError, and another worker receives it again", async (t) => {
  const db = await setup(t, "stuck");
  const { w, e0, errors, never } = await stuckWorker(db, "stuck", { leaseTtlMs: 1500 });
  try {
    const gaveUp = await assertGivesUp("stop()", w.stop({ timeoutMs: 200 }), w, errors, e0);
    assert.match(gaveUp.message, new RegExp(`slot 0 event ${e0}\\b`));
    assert.ok(await within(w.kill(), 5000), "kill() after the stop resolves within 5 s");
    // Nothing was acknowledged: the next owner receives the event again
    // once the first worker's lease ran out.
    const got = gate();
    const next: Message[] = [];
    db.track(await work(db.pool, { ...fast, queue: "stuck", consumer: "c", slots: 1, leaseTtlMs: 1500 }, (m: Message) => {
      next.push(m);
      got.open();
    }));
    await got.wait;
    assert.equal(next[0]!.id, e0);
  } finally {
    never.open();
  }
  await waitFor("the abandoned handler to return", () => w.stats().running === 0);
});

test("kill() gives up on a handler that ignores its signal before its key was held, and names it", async (t) => {
  const db = await setup(t, "stuckkill");
  // A long holdAfterMs: the chunk waits for its lane, which is never held.
  const { w, e0, errors, never } = await stuckWorker(db, "stuckkill", { holdAfterMs: 600_000 });
  try {
    await assertGivesUp("kill()", w.kill(), w, errors, e0);
  } finally {
    never.open();
  }
  await waitFor("the abandoned handler to return", () => w.stats().running === 0);
});

test("workTx: a hard stop gives up on a handler that holds its transaction: its connection is destroyed, its writes roll back, pool.end() returns", async (t) => {
  const db = await setup(t, "stucktx");
  await db.pool.query("create table stuck_effects (id text primary key)");
  // The worker's own pool, for the test to end.
  const txPool = new pg.Pool({ connectionString: db.url, max: 4 });
  txPool.on("error", () => {});
  const started = gate();
  const never = gate(); // opened only at the end
  const errors: unknown[] = [];
  let late: unknown = "the handler never returned";
  const returned = gate();
  const w1 = db.track(await workTx(txPool, { ...fast, queue: "stucktx", consumer: "c", slots: 1, leaseTtlMs: 1500, onError: (e) => errors.push(e) }, async (m, tx) => {
    await tx.query("insert into stuck_effects values ($1)", [m.id]);
    started.open();
    await never.wait;
    try {
      await tx.query("insert into stuck_effects values ($1)", [m.id + "-late"]);
      late = null;
    } catch (err) {
      late = err;
    } finally {
      returned.open();
    }
  }));
  try {
    const [e0] = await sendKeyed(db.pool, "stucktx", ["k"], 1);
    await started.wait;
    const t0 = performance.now();
    assert.ok(await within(w1.stop({ timeoutMs: 200 }), 5000), "stop() resolves within 5 s while the handler ignores its signal");
    const elapsed = performance.now() - t0;
    assert.ok(elapsed < 3000, `stop() took ${elapsed} ms`);
    const gaveUp = errors.filter((e) => e instanceof HandlersStillRunningError);
    assert.equal(gaveUp.length, 1, `onError saw ${errors.map(String).join("; ")}`);
    assert.deepEqual(gaveUp[0]!.running, [{ slot: 0, eventId: e0 }]);
    // The handler's connection is gone, not checked out: the pool ends.
    assert.ok(await within(txPool.end(), 5000), "the worker's pool ends within 5 s");
    // Its transaction rolled back: the same key inserts (it would wait on
    // the uncommitted row's lock, up to the lock timeout, if it were open).
    const c = await db.pool.connect();
    try {
      await c.query("begin");
      await c.query("set local lock_timeout = '5s'");
      await c.query("insert into stuck_effects values ($1)", [e0]);
      await c.query("rollback");
    } finally {
      c.release();
    }
    // Nothing was completed or acknowledged: the next owner handles the
    // event again and commits its effect.
    const got = gate();
    db.track(await workTx(db.pool, { ...fast, queue: "stucktx", consumer: "c", slots: 1, leaseTtlMs: 1500 }, async (m, tx) => {
      await tx.query("insert into stuck_effects values ($1)", [m.id]);
      got.open();
    }));
    await got.wait;
    await waitFor("the redelivered event's effect to commit", async () => (await db.pool.query("select 1 from stuck_effects where id = $1", [e0])).rowCount === 1);
  } finally {
    never.open();
  }
  await returned.wait;
  assert.ok(late instanceof Error, "the abandoned handler's statement after the give-up failed");
  await waitFor("the abandoned handler to return", () => w1.stats().running === 0);
  const { rows } = await db.pool.query("select id from stuck_effects order by id");
  assert.equal(rows.length, 1, `effects: ${JSON.stringify(rows)}`);
  assert.equal(w1.stats().handled, 0, "the abandoned event does not count as handled");
});
