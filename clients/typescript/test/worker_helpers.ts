// Helpers of the worker tests: a queue with a fast test ticker, sends, and
// a recorder that checks the per-key guarantees as events are handled.

import pg from "pg";
import { withTransaction, type Executor, type Message, type Worker } from "../src/index.js";
import { afterTheRest, testDb, type AfterHost, type TestDb } from "./harness.js";

/** Creates queue name and settings for quick tests (max_retries given). */
export async function createQueue(pool: pg.Pool, name: string, maxRetries = 5): Promise<void> {
  await pool.query("select pgque.create_queue($1)", [name]);
  await pool.query("select pgque.set_queue_config($1, 'max_retries', $2)", [name, String(maxRetries)]);
}

/**
 * Ticks queue every intervalMs (force_next_tick + ticker in one
 * transaction, then maint_retry_events so retries come back) until the
 * returned stop function is called: what a ticker daemon would do, fast.
 */
export function runTicker(pool: pg.Pool, queue: string, intervalMs = 20): () => Promise<void> {
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      // The test's database may be gone already: then the ticker ends.
      const c = await pool.connect().catch(() => null);
      if (c === null) break;
      try {
        await c.query("begin");
        await c.query("select pgque.force_next_tick($1)", [queue]);
        await c.query("select pgque.ticker($1)", [queue]);
        await c.query("commit");
        await c.query("select pgque.maint_retry_events()");
      } catch {
        await c.query("rollback").catch(() => {});
      } finally {
        c.release();
      }
      await new Promise((r) => setTimeout(r, intervalMs));
    }
  })();
  return async () => {
    stopped = true;
    await loop;
  };
}

/** Makes queue's pending events visible to consumers now: force_next_tick and ticker in one transaction always tick. */
export async function tickNow(pool: pg.Pool, queue: string): Promise<void> {
  await withTransaction(pool, async (tx: Executor) => {
    await tx.query("select pgque.force_next_tick($1)", [queue]);
    await tx.query("select pgque.ticker($1)", [queue]);
  });
}

/**
 * As a worker would, through the SQL API: claims key's slot of consumer
 * (nslots slots) as worker "w1", receives its chunk, nacks the chunk's
 * first event with retry delay `delay` and reason "boom", and
 * acknowledges the chunk. Under the pause policy the key is then blocked.
 * Returns the slot and the id of the event it failed.
 */
export async function failFirst(pool: pg.Pool, queue: string, consumer: string, nslots: number, key: string, delay = "1 hour"): Promise<{ slot: number; failed: string }> {
  const slot = (await pool.query("select pgque.slot_of($1, $2) as s", [key, nslots])).rows[0].s as number;
  const lease = (await pool.query("select epoch::text, token from pgque.claim_slot($1, $2, $3, 'w1', '30 seconds')", [queue, consumer, slot])).rows[0];
  const got = (await pool.query("select msg_id::text as id, batch_id::text, epoch::text from pgque.receive_partitioned($1, $2, $3, $4, 'w1', $5, 10)",
    [queue, consumer, slot, nslots, lease.token])).rows;
  const proof = [queue, consumer, slot, nslots, lease.token, got[0].epoch, got[0].batch_id, got[0].id];
  await pool.query("select pgque.nack_partitioned($1, $2, $3, $4, 'w1', $5, $6, $7, $8, $9::interval, 'boom')", [...proof, delay]);
  await pool.query("select pgque.ack_partitioned($1, $2, $3, $4, 'w1', $5, $6, $7, $8)", proof);
  return { slot, failed: got[0].id };
}

/**
 * Sends n events per key, payload {k, i}, keys interleaved, in one
 * transaction; returns their ids in send order.
 */
export async function sendKeyed(pool: pg.Pool, queue: string, keys: (string | null)[], n: number, type = "t"): Promise<string[]> {
  const ids: string[] = [];
  const c = await pool.connect();
  try {
    await c.query("begin");
    for (let i = 0; i < n; i++) {
      for (const k of keys) {
        const { rows } = await c.query<{ id: string }>(
          "select pgque.send($1::text, $2::text, $3::jsonb, $4::text)::text as id",
          [queue, type, JSON.stringify({ k, i }), k],
        );
        ids.push(rows[0]!.id);
      }
    }
    await c.query("commit");
  } catch (err) {
    await c.query("rollback").catch(() => {});
    throw err;
  } finally {
    c.release();
  }
  return ids;
}

/**
 * Records handled events per key and checks G1 (a key's events in order)
 * and G2 (at most one event of a key in a handler at a time) as they run.
 */
export class Recorder {
  readonly seen = new Map<string | null, string[]>();
  readonly inflight = new Map<string | null, number>();
  readonly violations: string[] = [];
  private waiters: { n: number; resolve: () => void }[] = [];
  total = 0;

  enter(m: Message): void {
    const n = (this.inflight.get(m.key) ?? 0) + 1;
    this.inflight.set(m.key, n);
    if (n > 1) this.violations.push(`G2: ${n} events of key ${String(m.key)} in handlers at once (event ${m.id})`);
  }

  leave(m: Message, ok: boolean): void {
    this.inflight.set(m.key, (this.inflight.get(m.key) ?? 1) - 1);
    if (!ok) return;
    const list = this.seen.get(m.key) ?? [];
    const last = list.at(-1);
    if (last !== undefined && BigInt(last) >= BigInt(m.id)) {
      this.violations.push(`G1: key ${String(m.key)} handled ${m.id} after ${last}`);
    }
    list.push(m.id);
    this.seen.set(m.key, list);
    this.total++;
    this.waiters = this.waiters.filter((w) => {
      if (this.total >= w.n) w.resolve();
      return this.total < w.n;
    });
  }

  /** Resolves once n events were handled successfully. */
  handled(n: number, timeoutMs = 20_000): Promise<void> {
    if (this.total >= n) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`only ${this.total} of ${n} events handled after ${timeoutMs} ms`)), timeoutMs);
      this.waiters.push({ n, resolve: () => (clearTimeout(t), resolve()) });
    });
  }
}

/** A barrier of n parties: arrive() resolves once n have arrived, or rejects after timeoutMs. */
export function barrier(n: number, timeoutMs: number): { arrive(): Promise<void>; arrived(): number } {
  let count = 0;
  let open!: () => void;
  const opened = new Promise<void>((r) => (open = r));
  return {
    arrive() {
      if (++count >= n) open();
      return Promise.race([
        opened,
        new Promise<void>((_, reject) => setTimeout(() => reject(new Error(`barrier: ${count} of ${n} arrived within ${timeoutMs} ms`)), timeoutMs).unref()),
      ]);
    },
    arrived: () => count,
  };
}

/** A promise with its resolve function, for a test to release a handler. */
export function gate(): { wait: Promise<void>; open(): void } {
  let open!: () => void;
  const wait = new Promise<void>((r) => (open = r));
  return { wait, open };
}

/**
 * A database with queue, a running test ticker, and track(w) for workers:
 * after the test, tracked workers are killed (a no-op once stopped), then
 * the test's own after hooks run, last-registered first (the pools it made
 * for its workers end there), then the ticker is stopped and the database
 * dropped, with no session of the test left to cut.
 */
export async function setup(t: AfterHost, queue: string, opts: { ticker?: boolean } = {}): Promise<TestDb & { track(w: Worker): Worker }> {
  let drop = async () => {};
  const db = await testDb({ t: { after: (fn) => void (drop = fn as () => Promise<void>) } });
  await createQueue(db.pool, queue);
  const stopTicker = opts.ticker === false ? async () => {} : runTicker(db.pool, queue);
  const workers: Worker[] = [];
  t.after(async () => void (await Promise.all(workers.map((w) => w.kill()))));
  afterTheRest(t, async () => {
    await stopTicker();
    await drop();
  });
  return Object.assign(db, { track: (w: Worker) => (workers.push(w), w) });
}
