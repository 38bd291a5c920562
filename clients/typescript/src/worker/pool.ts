// work(): a worker pool over the N slots of a partitioned consumer, in
// process, sharing the consumer with Go pools, relays and other
// TypeScript workers through the server's leases (see docs/worker-pool.md
// for the protocol; this is the same protocol).
//
// Timers and loops of one pool:
//   - the claim loop: a pass every jittered claimIntervalMs, and early when
//     a runner exits or a peer's presence hint arrives: read the leases,
//     plan the fair share, release / claim, announce (announce_worker) and
//     NOTIFY the peers' hint;
//   - one runner per claimed slot (slot.ts);
//   - the lease keeper: every TTL/10, renews leases running short and
//     fences those whose known end is near;
//   - the LISTEN connection (listener.ts): a tick of the queue wakes every
//     runner, a presence hint triggers a claim pass.

import pg from "pg";
import type { ConnectionSource } from "../executor.js";
import { mapError, PgqueError } from "../errors.js";
import { makePlan } from "./fairshare.js";
import { hintTag, Listener, presenceChannel, tickChannel, tickTag, type ListenConnect } from "./listener.js";
import { WorkerKilledError } from "./outcome.js";
import { defaultRetryDelay, SlotRunner, type Handler, type SlotEnv } from "./slot.js";
import * as q from "./sql.js";
import { Semaphore, Wake } from "./sync.js";
import type { FailurePolicy } from "../admin.js";
import { defaultWorkerId } from "../workerid.js";


export interface WorkOptions {
  queue: string;
  consumer: string;
  /** The consumer's slot count N (every worker of the consumer must agree). */
  slots: number;
  /**
   * skip (retry the failed event, go on with its key) or pause (hold the
   * key's later events until the failed one succeeds or is dead-lettered).
   * Persisted per consumer with its first slot; omitted keeps the persisted
   * one, another one than persisted fails with kind policy_mismatch.
   */
  failurePolicy?: FailurePolicy;
  /** Handlers running at once over all slots of this worker. Default 256, as the Go pool's MaxWorkers. */
  concurrency?: number;
  /** Aborts a handler's signal after this long and fails the event (0: none). Default 0. */
  handlerTimeoutMs?: number;
  /** Events received per chunk. Default 1000. */
  batchSize?: number;
  /** Most slots this worker works at once. Default N. */
  maxActiveSlots?: number;
  /** Slot lease lifetime. Default 30 s, at least 1 s. */
  leaseTtlMs?: number;
  /** Claim loop period (±20%). Default 1 s. */
  claimIntervalMs?: number;
  /** Poll period of an idle slot when no tick wakes it (±20%). Default 1 s. */
  pollIntervalMs?: number;
  /** The delay before a failed event's retry. Default 1 s doubled per retry, capped at 10 min, ±10%. */
  retryDelayMs?: (retryCount: number) => number;
  /** How long the stragglers of a chunk run before their keys are held. Default 50 ms. */
  holdAfterMs?: number;
  /** The worker's id, shown in leases and status. Default host-pid-random. */
  workerId?: string;
  /**
   * Opens the dedicated LISTEN connection. Default: a pg.Client with the
   * pool's options when the pool is a pg.Pool; `false` polls only (e.g.
   * behind a transaction pooler).
   */
  listen?: ListenConnect | false;
  /** Receives errors the pool recovers from. Default: console.warn. */
  onError?: (err: unknown) => void;
}

export interface StopOptions {
  /** false: stop hard at once (as kill()). Default true. */
  graceful?: boolean;
  /** A graceful stop that has not finished after this long turns hard. */
  timeoutMs?: number;
}

/** A running worker pool. */
export interface Worker {
  readonly workerId: string;
  /** The slots this worker works now. */
  ownedSlots(): number[];
  /**
   * Stops fetching, lets each slot finish and acknowledge its chunk in
   * flight and settle its held keys, releases the leases. Idempotent.
   */
  stop(opts?: StopOptions): Promise<void>;
  /**
   * Stops hard: handlers' signals are aborted, nothing more is
   * acknowledged or released; the next owner receives the chunks in flight
   * again after the lease TTL.
   */
  kill(): Promise<void>;
}

/**
 * Handlers running at once in one worker by default: the Go pool's
 * MaxWorkers default. A chunk of 200 keys with a 20 ms handler needs 200
 * places to run at once; 64 held it to a third of that.
 */
export const CONCURRENCY_DEFAULT = 256;

function listenFrom(db: ConnectionSource): ListenConnect | null {
  const opts = (db as { options?: pg.ClientConfig }).options;
  if (!(db instanceof pg.Pool) || !opts) return null;
  return async () => {
    const c = new pg.Client(opts);
    await c.connect();
    return c;
  };
}

function positive(name: string, v: number | undefined, def: number, min = 1): number {
  if (v === undefined) return def;
  if (!Number.isFinite(v) || v < min) throw new PgqueError(`work: ${name} must be a number of at least ${min}, not ${v}`, "invalid_argument");
  return v;
}

/**
 * Starts a worker pool on the partitioned consumer opts.consumer of
 * opts.queue: subscribes its slots (idempotently), then claims its fair
 * share of them and calls handler for every event, each key's events in
 * order and one at a time. Resolves once the slots are subscribed.
 */
export async function work<P = unknown>(db: ConnectionSource, opts: WorkOptions, handler: Handler<P>): Promise<Worker> {
  const nslots = positive("slots", opts.slots, NaN);
  if (!Number.isInteger(nslots)) throw new PgqueError(`work: slots must be an integer, not ${nslots}`, "invalid_argument");
  if (opts.failurePolicy !== undefined && opts.failurePolicy !== "skip" && opts.failurePolicy !== "pause") {
    throw new PgqueError(`work: failurePolicy must be "skip" or "pause", not ${String(opts.failurePolicy)}`, "invalid_argument");
  }
  const leaseTtlMs = positive("leaseTtlMs", opts.leaseTtlMs, 30_000, 1000);
  const claimIntervalMs = positive("claimIntervalMs", opts.claimIntervalMs, 1000, 10);
  const worker = opts.workerId ?? defaultWorkerId();
  const onError = opts.onError ?? ((err: unknown) => console.warn("pgque worker:", err));
  const where = `consumer ${JSON.stringify(opts.consumer)} of queue ${JSON.stringify(opts.queue)}`;

  // Subscribe the N slots in one transaction and read the persisted policy.
  let policy: string;
  const conn = await db.connect();
  try {
    await conn.query("begin");
    for (let s = 0; s < nslots; s++) await q.subscribeSlot(conn, opts.queue, opts.consumer, s, nslots, opts.failurePolicy ?? null);
    policy = (await q.slotPolicy(conn, opts.queue, opts.consumer)) ?? "skip";
    await conn.query("commit");
  } catch (err) {
    await conn.query("rollback").catch(() => {});
    throw mapError(`subscribing ${nslots} slots of ${where}`, err);
  } finally {
    conn.release();
  }

  const fetchCtl = new AbortController();
  const killCtl = new AbortController();
  const runners = new Map<number, SlotRunner>();
  const holdoff = new Map<number, number>();
  let prevFree = new Set<number>();
  let peers = new Map<string, boolean>();
  const trigger = new Wake();
  const presenceTtl = 3 * claimIntervalMs;

  const env: SlotEnv = {
    db,
    queue: opts.queue,
    consumer: opts.consumer,
    worker,
    nslots,
    batchSize: positive("batchSize", opts.batchSize, 1000),
    leaseTtlMs,
    pollIntervalMs: positive("pollIntervalMs", opts.pollIntervalMs, 1000, 10),
    handlerTimeoutMs: opts.handlerTimeoutMs ?? 0,
    holdAfterMs: positive("holdAfterMs", opts.holdAfterMs, 50, 1),
    maxHeldEvents: 10 * positive("batchSize", opts.batchSize, 1000),
    retryDelayMs: opts.retryDelayMs ?? defaultRetryDelay,
    handler: handler as Handler,
    sem: new Semaphore(positive("concurrency", opts.concurrency, CONCURRENCY_DEFAULT)),
    fetch: fetchCtl.signal,
    kill: killCtl.signal,
    policy: () => policy,
    setPolicy: (p) => {
      policy = p;
    },
    onError,
    onFenced: () => trigger.fire(),
  };
  const maxActive = Math.min(nslots, positive("maxActiveSlots", opts.maxActiveSlots, nslots));

  const listenConnect = opts.listen === false ? null : opts.listen ?? listenFrom(db);
  const listener = listenConnect ? new Listener(listenConnect, (err) => onError(mapError("listening for wake-ups", err))) : null;
  const hint = hintTag(opts.queue, opts.consumer);
  let lastHint = 0;
  listener?.on(tickChannel, tickTag(opts.queue), () => {
    for (const r of runners.values()) r.wake();
  });
  listener?.on(presenceChannel, hint, () => {
    // A forged flood of hints costs at most one early pass per quarter interval.
    const now = Date.now();
    if (now - lastHint < claimIntervalMs / 4) return;
    lastHint = now;
    trigger.fire();
  });

  function start(slot: number, lease: q.Lease, at: number): void {
    const r = new SlotRunner(env, slot, lease, at, runners.get(slot)?.done);
    runners.set(slot, r);
    void r.done.finally(() => {
      if (runners.get(slot) === r) runners.delete(slot);
      trigger.fire();
    });
  }

  async function pass(): Promise<void> {
    const now = Date.now();
    const leases = await q.slotLeases(db, opts.queue, opts.consumer);
    const owners: (string | null)[] = Array.from({ length: nslots }, () => null);
    for (const l of leases) if (l.slot < nslots && l.live) owners[l.slot] = l.owner;
    const running = new Map<number, boolean>();
    for (const [s, r] of runners) if (!r.fenced) running.set(s, r.releaseRequested);
    const hold = new Set<number>();
    for (const [s, until] of holdoff) {
      if (now < until) hold.add(s);
      else holdoff.delete(s);
    }
    const plan = makePlan({ self: worker, slots: nslots, maxActive, owners, running, peers, holdoff: hold, prevFree });
    for (const s of plan.release) {
      runners.get(s)?.requestRelease();
      holdoff.set(s, now + 2 * claimIntervalMs);
    }
    let owned = running.size - plan.release.length - [...running.values()].filter(Boolean).length;
    for (const s of plan.claim) {
      if (fetchCtl.signal.aborted) return;
      const at = Date.now();
      const lease = await q.claimSlot(db, opts.queue, opts.consumer, s, worker, leaseTtlMs, null);
      if (lease === null) continue; // another worker was faster
      start(s, lease, at);
      owned++;
    }
    prevFree = plan.free;
    const mine = [...runners.keys()].filter((s) => !runners.get(s)!.releaseRequested && !runners.get(s)!.fenced).sort((a, b) => a - b);
    const heard = await q.announce(db, opts.queue, opts.consumer, worker, owned < plan.target, mine, presenceTtl);
    const next = new Map<string, boolean>();
    let news = false;
    for (const p of heard) {
      if (p.worker === worker) continue;
      if (!peers.has(p.worker) || (p.hungry && !peers.get(p.worker))) news = true;
      next.set(p.worker, p.hungry);
    }
    peers = next;
    if (listener) await q.notify(db, presenceChannel, hint);
    if (news) trigger.fire();
  }

  const coordinator = (async () => {
    while (!fetchCtl.signal.aborted) {
      try {
        await pass();
      } catch (err) {
        if (!fetchCtl.signal.aborted) onError(mapError(`claim pass of ${where}`, err));
      }
      await trigger.wait(claimIntervalMs, fetchCtl.signal);
    }
  })();

  const keeper = setInterval(() => {
    const now = Date.now();
    for (const r of runners.values()) void r.keep(now);
  }, leaseTtlMs / 10);
  keeper.unref();

  let stopped: Promise<void> | null = null;
  async function finish(): Promise<void> {
    await coordinator;
    await Promise.all([...runners.values()].map((r) => r.done));
    clearInterval(keeper);
    await listener?.close();
  }

  async function kill(): Promise<void> {
    fetchCtl.abort();
    if (!killCtl.signal.aborted) {
      killCtl.abort(new WorkerKilledError());
      for (const r of runners.values()) r.abandon(killCtl.signal.reason);
    }
    stopped ??= finish();
    await stopped;
  }

  return {
    workerId: worker,
    ownedSlots: () => [...runners].filter(([, r]) => !r.fenced).map(([s]) => s).sort((a, b) => a - b),
    async stop(so: StopOptions = {}) {
      if (so.graceful === false) return kill();
      fetchCtl.abort();
      for (const r of runners.values()) r.wake();
      stopped ??= finish();
      if (so.timeoutMs === undefined) return stopped;
      let t: NodeJS.Timeout | undefined;
      const timedOut = new Promise<boolean>((r) => (t = setTimeout(() => r(true), so.timeoutMs)));
      const late = await Promise.race([stopped.then(() => false), timedOut]);
      clearTimeout(t);
      if (late) await kill();
    },
    kill,
  };
}
