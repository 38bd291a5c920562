// work(): a worker pool over the N slots of a partitioned consumer, in
// process, sharing the consumer with Go pools, relays and other
// TypeScript workers through the server's leases (see docs/worker-pool.md
// for the protocol; this is the same protocol).
//
// Timers and loops of one pool:
//   - the claim loop: a pass every jittered claimIntervalMs, and early when
//     a runner exits or a peer's presence hint arrives: follow a resize of
//     the consumer's N (slot_group_info), read the leases,
//     plan the fair share, release / claim, announce (announce_worker) and
//     NOTIFY the peers' hint;
//   - one runner per claimed slot (slot.ts);
//   - the lease keeper: every TTL/10, renews leases running short and
//     fences those whose known end is near;
//   - the LISTEN connection (listener.ts): a tick of the queue wakes the
//     runners of the slots it touched, a presence hint triggers a claim
//     pass.
//
// Following a resize (as the Go pool does, see docs/design.md, "Online
// resize of N"): the cutover deletes the old slots' subscriptions and
// leases in one transaction, and every call naming the old N fails from
// then on (PQ030, or PQ034/PQ011/PQ032 for one that raced with it). The
// pool reads the consumer's N on every pass; a runner whose call fails so
// asks the pool to read it at once and, when it changed, leaves its slot
// without acknowledging or releasing anything. Runners of the old N still
// working are asked to give their slot up at the next chunk boundary, and
// slot k of the new N is claimed only once the old runner of k is gone
// (runners are keyed by slot number), so this process never works slot k
// of two N at once. The server stays the authority: a runner with a stale
// N can neither receive nor acknowledge.

import { setMaxListeners } from "node:events";
import { checkout, type ConnectionSource } from "../executor.js";
import { isPgqueError, mapError, PgqueError } from "../errors.js";
import { checkSchema } from "../migrate.js";
import { HintGate, left, makePlan } from "./fairshare.js";
import { hintTag, leaveTag, Listener, listenFrom, parseTouched, presenceChannel, slotsChannel, tickChannel, tickTag, touchedHas, type ListenConnect, type Touched } from "./listener.js";
import { clampRetryDelay, HandlersStillRunningError, WorkerKilledError } from "./outcome.js";
import { ReceiveGather } from "./gather.js";
import { defaultRetryDelay, SlotRunner, type HandleCounters, type HandleResult, type Handler, type SlotEnv } from "./slot.js";
import type { Message } from "./message.js";
import * as q from "./sql.js";
import { Semaphore, Wake } from "./sync.js";
import type { FailurePolicy } from "../admin.js";
import { defaultWorkerId, WORKER_ID_MAX_BYTES } from "../workerid.js";
import { unstorable } from "../event.js";


/** P is the payload type the handler expects, as in work<P>; onHandled sees the same. */
export interface WorkOptions<P = unknown> {
  queue: string;
  consumer: string;
  /**
   * The consumer's slot count N (every worker of the consumer must agree).
   * When the consumer was resized from this N, or is being resized to it,
   * the worker works the consumer's current N instead; it follows every
   * later resize by itself. Any other N fails with kind slot_count_mismatch.
   */
  slots: number;
  /**
   * skip (retry the failed event, go on with its key) or pause (hold the
   * key's later events until the failed one succeeds or is dead-lettered).
   * Persisted per consumer with its first slot; omitted keeps the persisted
   * one, another one than persisted fails with kind policy_mismatch.
   */
  failurePolicy?: FailurePolicy;
  /**
   * Handlers running at once over all slots of this worker. Default 256, as
   * the Go pool's MaxWorkers; under workTx on a pg.Pool, the pool's max
   * less 2 and one per two slots, at most half the pool (each handler
   * holds a connection; txSpare).
   */
  concurrency?: number;
  /**
   * Aborts a handler's signal after this long and fails the event. Default
   * 0: none, as is Infinity; at most 2^31 − 1 ms (what a timer can wait).
   */
  handlerTimeoutMs?: number;
  /** Events received per chunk, an integer from 1 to 100 000. Default 1000. */
  batchSize?: number;
  /**
   * The slots one tick wakes receive in one call (receive_partitioned_raw_slots)
   * instead of one call each: less server CPU per event, more latency, since
   * the call serves its slots one after another. Default false.
   */
  gatherReceives?: boolean;
  /** Most slots this worker works at once (an integer). Default N, whatever N becomes. */
  maxActiveSlots?: number;
  /** Slot lease lifetime, 1 s to 1 day. Default 30 s. */
  leaseTtlMs?: number;
  /** Claim loop period (±20%), 10 ms to 200 s (a presence lasts three). Default 1 s. */
  claimIntervalMs?: number;
  /** Poll period of an idle slot when no tick wakes it (±20%), 10 ms to 1 day. Default 1 s. */
  pollIntervalMs?: number;
  /**
   * The delay before a failed event's retry. Default 1 s doubled per retry,
   * capped at 10 min, ±10%. Brought into 0 to RETRY_DELAY_MS_MAX (30 days).
   */
  retryDelayMs?: (retryCount: number) => number;
  /**
   * How long the stragglers of a chunk run, each in one handler, before
   * their keys are held, 1 ms to 1 day; a straggler whose events left would
   * take BUSY_HOLD_FACTOR (10) times this, or that has kept the chunk open
   * that long, is held however fast each handler is (a hot key). Default
   * 50 ms.
   */
  holdAfterMs?: number;
  /** The worker's id, shown in leases and status, 1 to 200 bytes of UTF-8. Default host-pid-random. */
  workerId?: string;
  /**
   * Opens the dedicated LISTEN connection. Default: a pg.Client with the
   * pool's options when the pool is a pg.Pool; `false` polls only (e.g.
   * behind a transaction pooler). Each time it connects, the worker sends
   * it a notification through the pool; when that does not arrive within
   * PROBE_WAIT_MS (a transaction pooler drops notifications), onError gets
   * a ListenNotDeliveringError.
   */
  listen?: ListenConnect | false;
  /**
   * Receives errors the pool recovers from: a failed receive, claim pass,
   * renewal, settle or LISTEN connection (each retried), and a
   * LeaseLostError (with its slot) for each slot it fenced: the chunk in
   * hand is delivered again; a HandlersStillRunningError when a hard
   * stop abandoned handlers that ignore their signal; and a
   * ListenNotDeliveringError when the LISTEN connection does not get
   * notifications (see listen). Default:
   * console.warn. Handler errors are not among them (onHandled).
   */
  onError?: (err: unknown) => void;
  /**
   * Called after every handler call, with what it threw (undefined when
   * it returned), how long it ran and, after a throw, the retry delay
   * (null: dead-lettered at once). For logs, metrics and traces; a throw
   * from it goes to onError.
   */
  onHandled?: (msg: Message<P>, result: HandleResult) => void;
  /**
   * Called when this worker starts working a slot (it claimed the slot's
   * lease) and when it stops (a stop, its fair share, a resize, or a fence
   * when the lease expired or another worker took it). Between the two the
   * slot's events come to this worker, as Kafka's partitions between an
   * assignment and a revocation. For logs, metrics and per-slot state; a
   * throw from it goes to onError.
   */
  onSlot?: (change: SlotChange) => void;
}

/** A slot this worker started or stopped working (WorkOptions.onSlot). */
export interface SlotChange {
  /** "claimed": the lease is this worker's and it starts; "ended": it stopped working the slot. */
  kind: "claimed" | "ended";
  slot: number;
  /** The consumer's slot count the slot belongs to. */
  nslots: number;
  /** The lease epoch: each claim of a slot has a greater one (as Message.epoch). */
  epoch: bigint;
  /** With "ended": the worker fenced the slot (its lease expired, or another worker holds it now). */
  fenced?: boolean;
}

/** What a worker did since it started, read by Worker.stats(). */
export interface WorkerStats {
  /** Handler calls that returned: those events are done. */
  handled: number;
  /** Handler calls that threw: retried later or dead-lettered. */
  failed: number;
  /** Handler calls running now. */
  running: number;
  /** Errors passed to onError. */
  errors: number;
  /** The last of them, if any. */
  lastError: unknown;
  /** The slots this worker works now. */
  ownedSlots: number[];
}

export interface StopOptions {
  /** false: stop hard at once (as kill()). Default true. */
  graceful?: boolean;
  /**
   * A graceful stop that has not finished after this long turns hard
   * (kill()), so the stop resolves at most ABANDON_WAIT_MS later even when
   * a handler ignores its signal. Without it (or with Infinity, or more
   * than 2^31 − 1 ms, which no timer can wait) a graceful stop waits for
   * every handler to return, however long that takes. A negative or NaN
   * one makes stop() reject with kind invalid_argument, stopping nothing.
   */
  timeoutMs?: number;
}

/** A running worker pool. */
export interface Worker {
  readonly workerId: string;
  /** The slots this worker works now. */
  ownedSlots(): number[];
  /**
   * Counters since start: handled and failed events, handlers running,
   * recovered errors. The consumer's lag and its slots' leases, seen by
   * the server and across all workers, are slots(db, queue, consumer).
   */
  stats(): WorkerStats;
  /**
   * Stops fetching, lets each slot finish and acknowledge its chunk in
   * flight and settle its held keys, releases the leases. Idempotent. With
   * timeoutMs it turns into kill() when not done by then, and resolves as
   * kill() does; it rejects only for a timeoutMs that is no delay
   * (StopOptions.timeoutMs), before stopping anything.
   */
  stop(opts?: StopOptions): Promise<void>;
  /**
   * Stops hard: handlers' signals are aborted, nothing more is
   * acknowledged or released; the next owner receives the chunks in flight
   * again after the lease TTL. Resolves once every handler has returned,
   * or ABANDON_WAIT_MS after aborting them when some ignore their signal:
   * those are abandoned and named by a HandlersStillRunningError passed to
   * onError (a rejection would be unhandled in the usual
   * `process.on("SIGTERM", () => void worker.stop(...))`, and the process
   * should go on shutting down). An abandoned handler's key gets no next
   * event from this worker, which fetches nothing more; under workTx its
   * connection is destroyed, so its transaction rolls back and it does not
   * hold pool.end(). It never rejects.
   */
  kill(): Promise<void>;
}

/**
 * Handlers running at once in one worker by default: the Go pool's
 * MaxWorkers default. A chunk of 200 keys with a 20 ms handler needs 200
 * places to run at once; 64 held it to a third of that.
 */
export const CONCURRENCY_DEFAULT = 256;

/**
 * How long kill() waits, after aborting the handlers' signals, for those
 * that ignore theirs before it abandons them and resolves: 1 s, the Go
 * library's AbandonWait. A SIGTERM budget is stop's timeoutMs plus this.
 */
export const ABANDON_WAIT_MS = 1000;

/** How long a graceful stop's last announcement (that the worker left) may take: the Go pool's leaveWait. */
const LEAVE_WAIT_MS = 2000;

/** The longest delay setTimeout keeps: a longer one (Infinity too) fires after 1 ms. */
const TIMER_MS_MAX = 2 ** 31 - 1;
/** The largest chunk the server delivers (receive_partitioned_raw's max), as Go's BatchSizeMax. */
const BATCH_SIZE_MAX = 100_000;
/** The largest slot count N the server accepts (subscribe_slot), as Go's SlotsMax. */
const SLOTS_MAX = 1024;
/**
 * The shortest slot lease work() takes (leases are renewed at a fraction
 * of it), as Go's LeaseTTLMin, and the longest the server grants
 * (claim_slot), as Go's LeaseTTLMax.
 */
const LEASE_TTL_MS_MIN = 1000;
const LEASE_TTL_MS_MAX = 24 * 3600 * 1000;
/**
 * The longest claim interval: a worker's presence lasts three of them, and
 * announce_worker accepts at most 10 minutes.
 */
const CLAIM_INTERVAL_MS_MAX = 200_000;
/** The longest poll interval and holdAfterMs: a day, well within what a timer can wait with its jitter. */
const WAIT_MS_MAX = 24 * 3600 * 1000;

/** v as an error message shows it: a string is said to be one ("4" is no 4). */
function shown(v: unknown): string {
  if (typeof v === "string") return `the string ${JSON.stringify(v)}`;
  if (typeof v === "number" || typeof v === "boolean" || v === null || v === undefined) return String(v);
  return `a${typeof v === "object" ? "n" : ""} ${typeof v}`;
}

/**
 * Option name of work(): def when absent, else v when it is a number from
 * min to max (an integer when integer is set); otherwise a PgqueError of
 * kind invalid_argument naming the option and the value. Checked before
 * the database is touched: a value the server refuses (batchSize 1.5,
 * leaseTtlMs 1e12) failed every receive or claim for ever instead, and a
 * value past TIMER_MS_MAX made its timer fire after 1 ms.
 */
function numberOption(name: string, v: unknown, def: number, min: number, max: number, integer = false): number {
  if (v === undefined) return def;
  if (typeof v !== "number" || !(v >= min && v <= max) || (integer && !Number.isInteger(v))) {
    throw new PgqueError(`work: ${name} must be ${integer ? "an integer" : "a number"} from ${min} to ${max}, not ${shown(v)}`, "invalid_argument");
  }
  return v;
}

/**
 * handlerTimeoutMs as the runner takes it: 0 for none (absent, 0 or
 * Infinity), else a delay setTimeout can wait.
 */
function handlerTimeoutOption(v: unknown): number {
  if (v === undefined || v === Infinity) return 0;
  return numberOption("handlerTimeoutMs", v, 0, 0, TIMER_MS_MAX);
}

/** workerId: 1 to WORKER_ID_MAX_BYTES bytes of UTF-8 that PostgreSQL text stores as given. */
function workerIdOption(v: unknown): string {
  if (v === undefined) return defaultWorkerId();
  if (typeof v !== "string") throw new PgqueError(`work: workerId must be a string, not ${shown(v)}`, "invalid_argument");
  const bytes = Buffer.byteLength(v);
  if (bytes === 0 || bytes > WORKER_ID_MAX_BYTES) {
    throw new PgqueError(`work: workerId must be 1 to ${WORKER_ID_MAX_BYTES} bytes of UTF-8, not ${bytes}`, "invalid_argument");
  }
  const bad = unstorable(v);
  if (bad !== null) throw new PgqueError(`work: workerId holds ${bad}, which PostgreSQL text cannot store as given`, "invalid_argument");
  return v;
}

/**
 * stop()'s timeoutMs as a timer takes it, or undefined for no limit:
 * absent, Infinity, or longer than a timer can wait (24.8 days: no stop
 * waits that long with a limit in mind; setTimeout turned it into 1 ms,
 * and the stop into a kill). A negative or NaN one is refused (a kill at
 * once is stop({ graceful: false })), before anything is stopped.
 */
function stopTimeout(v: unknown): number | undefined {
  if (v === undefined || (typeof v === "number" && v > TIMER_MS_MAX)) return undefined;
  if (typeof v !== "number" || !(v >= 0)) {
    throw new PgqueError(`worker.stop: timeoutMs must be a number of milliseconds of at least 0 (or Infinity: no limit), not ${shown(v)}`, "invalid_argument");
  }
  return v;
}

/**
 * The retryDelayMs option with its delays clamped into [0,
 * RETRY_DELAY_MS_MAX]: one the server refuses would fail the settle of its
 * event's whole chunk, again on every run of the chunk.
 */
function retryDelayOption(f: ((retryCount: number) => number) | undefined): (retryCount: number) => number {
  if (f === undefined) return defaultRetryDelay;
  return (retryCount) => clampRetryDelay(f(retryCount));
}

/**
 * The N work() subscribes and works: the configured one, or the consumer's
 * current N when the configured one is an N the consumer had before a
 * resize or the one it is being resized to (a process deployed with either
 * config follows the server). Any other N is left to the subscription to
 * refuse with PQ030.
 */
async function startSlots(db: ConnectionSource, queue: string, consumer: string, configured: number, where: string): Promise<number> {
  let g: q.SlotGroup;
  try {
    g = await q.slotGroupInfo(db, queue, consumer);
  } catch (err) {
    const e = mapError(`reading the slot count of ${where}`, err);
    if (isPgqueError(e, "slot_not_subscribed")) return configured; // a new consumer
    throw e;
  }
  const resized = g.pastNSlots.includes(configured) || g.resizeTo === configured;
  return resized ? g.nslots : configured;
}

/**
 * Starts a worker pool on the partitioned consumer opts.consumer of
 * opts.queue: subscribes its slots (idempotently), then claims its fair
 * share of them and calls handler for every event, each key's events in
 * order and one at a time. Resolves once the slots are subscribed; fails
 * first as checkSchema does (the schema is another version, or its owner
 * lacks a right this login has: trustSchema).
 */
export async function work<P = unknown>(db: ConnectionSource, opts: WorkOptions<P>, handler: Handler<P>): Promise<Worker> {
  if (opts.slots === undefined) throw new PgqueError("work: slots (the consumer's slot count) is required", "invalid_argument");
  const configured = numberOption("slots", opts.slots, NaN, 1, SLOTS_MAX, true);
  if (opts.failurePolicy !== undefined && opts.failurePolicy !== "skip" && opts.failurePolicy !== "pause") {
    throw new PgqueError(`work: failurePolicy must be "skip" or "pause", not ${String(opts.failurePolicy)}`, "invalid_argument");
  }
  const leaseTtlMs = numberOption("leaseTtlMs", opts.leaseTtlMs, 30_000, LEASE_TTL_MS_MIN, LEASE_TTL_MS_MAX);
  const claimIntervalMs = numberOption("claimIntervalMs", opts.claimIntervalMs, 1000, 10, CLAIM_INTERVAL_MS_MAX);
  const batchSize = numberOption("batchSize", opts.batchSize, 1000, 1, BATCH_SIZE_MAX, true);
  const pollIntervalMs = numberOption("pollIntervalMs", opts.pollIntervalMs, 1000, 10, WAIT_MS_MAX);
  const holdAfterMs = numberOption("holdAfterMs", opts.holdAfterMs, 50, 1, WAIT_MS_MAX);
  const handlerTimeoutMs = handlerTimeoutOption(opts.handlerTimeoutMs);
  if (opts.gatherReceives !== undefined && typeof opts.gatherReceives !== "boolean") {
    throw new PgqueError(`work: gatherReceives must be true or false, not ${shown(opts.gatherReceives)}`, "invalid_argument");
  }
  const concurrency = numberOption("concurrency", opts.concurrency, CONCURRENCY_DEFAULT, 1, Number.MAX_SAFE_INTEGER, true);
  const maxActiveOpt = numberOption("maxActiveSlots", opts.maxActiveSlots, Infinity, 1, Number.MAX_SAFE_INTEGER, true);
  const worker = workerIdOption(opts.workerId);
  const report = opts.onError ?? ((err: unknown) => console.warn("pgque worker:", err));
  const counters: HandleCounters = { handled: 0, failed: 0, running: 0 };
  let errors = 0;
  let lastError: unknown;
  const onError = (err: unknown) => {
    errors++;
    lastError = err;
    report(err);
  };
  const where = `consumer ${JSON.stringify(opts.consumer)} of queue ${JSON.stringify(opts.queue)}`;

  // The schema's version, and that its owner may be trusted with this
  // login's rights (trustSchema), before the first call into it.
  await checkSchema(db);
  let nslots = await startSlots(db, opts.queue, opts.consumer, configured, where);
  // Subscribe the N slots in one transaction and read the persisted policy.
  let policy: string;
  const conn = await checkout(db);
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
  const abandonCtl = new AbortController();
  // Every slot, and every waiting lane of it, listens on these three for
  // as long as it runs: Node's default of ten listeners per signal warned
  // of a leak in any process with more than ten slots.
  setMaxListeners(0, fetchCtl.signal, killCtl.signal, abandonCtl.signal);
  const runners = new Map<number, SlotRunner>();
  const holdoff = new Map<number, number>();
  let prevFree = new Set<number>();
  let peers = new Map<string, boolean>();
  const trigger = new Wake();
  const presenceTtl = 3 * claimIntervalMs;

  const env: SlotEnv = {
    db,
    gather: opts.gatherReceives === true ? new ReceiveGather(db, opts.queue, opts.consumer, worker, batchSize) : null,
    queue: opts.queue,
    consumer: opts.consumer,
    worker,
    batchSize,
    leaseTtlMs,
    pollIntervalMs,
    handlerTimeoutMs,
    holdAfterMs,
    maxHeldEvents: 10 * batchSize,
    retryDelayMs: retryDelayOption(opts.retryDelayMs),
    handler: handler as Handler,
    sem: new Semaphore(concurrency),
    fetch: fetchCtl.signal,
    kill: killCtl.signal,
    abandoned: abandonCtl.signal,
    policy: () => policy,
    setPolicy: (p) => {
      policy = p;
    },
    onError,
    onFenced: (reason) => {
      // As the Go pool logs a warning: the chunk in hand comes again.
      onError(reason);
      trigger.fire();
    },
    currentSlots: () => nslots,
    async slotCountChanged(n, err) {
      if (isPgqueError(err, "slot_count_mismatch") || isPgqueError(err, "slot_not_subscribed")) return true;
      // A call that raced with the cutover may fail otherwise (the slot
      // number is out of range for the new N): ask the server.
      if (n === nslots) await followResize();
      return n !== nslots;
    },
    onHandled: opts.onHandled as ((msg: Message, r: HandleResult) => void) | undefined,
    counters,
    session: () => listener?.sessionPid ?? 0,
  };
  const maxActive = () => Math.min(nslots, maxActiveOpt);

  /**
   * Reads the consumer's N and, when it changed, works the new one: the
   * runners of the old N are asked to give their slot up.
   */
  async function followResize(): Promise<void> {
    let g: q.SlotGroup;
    try {
      g = await q.slotGroupInfo(db, opts.queue, opts.consumer);
    } catch (err) {
      if (!fetchCtl.signal.aborted) onError(mapError(`reading the slot count of ${where}`, err));
      return;
    }
    if (g.nslots === nslots) return;
    nslots = g.nslots;
    for (const r of runners.values()) if (r.nslots !== nslots) r.requestRelease();
  }

  const listenConnect = opts.listen === false ? null : opts.listen ?? listenFrom(db);
  const listener = listenConnect
    ? new Listener(listenConnect, (err) => onError(mapError("listening for wake-ups", err)), [tickChannel, slotsChannel, presenceChannel],
        (channel, payload) => q.notify(db, channel, payload))
    : null;
  const hint = hintTag(opts.queue, opts.consumer);
  // A tick's touched set wakes only the slots it names. Once the server
  // has sent one, the plain tag (sent for every tick too, for clients that
  // cannot read sets) wakes nobody; a server without sets only sends the
  // tag, which wakes every slot. A reconnect ("") wakes every slot.
  const tag = tickTag(opts.queue);
  let sets = false;
  listener?.on(tickChannel, tag, (payload) => {
    if (payload === "" || !sets) for (const r of runners.values()) r.wake();
  });
  listener?.onPrefix(slotsChannel, tag + ":", (payload) => {
    const t: Touched | null = payload === "" ? { all: true } : parseTouched(payload, tag);
    if (t === null) return;
    if (payload !== "") sets = true;
    for (const [slot, r] of runners) if (touchedHas(t, r.nslots, slot)) r.wake();
  });
  // Leases are bound to the LISTEN session (design.md, "Dead holders"):
  // when it ends, those bound to it are given up unless rebound in time;
  // when a new one is up, every lease is renewed at once to bind it.
  listener?.onSession((pid, up) => {
    for (const r of runners.values()) {
      if (!up && r.session === pid) r.cap();
      else if (up && r.session !== pid) void r.renew();
    }
  });
  // Presence hints (a peer's pass) and leaves (a peer stopped), each
  // gated: a forged flood costs at most one early pass per quarter
  // interval and kind. One that comes within its gap runs a pass when the
  // gap ends rather than being dropped: a worker hears its own hint after
  // every pass, and a peer's that came just after waited for the next
  // pass, a claim interval away.
  const hintGate = new HintGate(claimIntervalMs / 4, () => trigger.fire());
  const leaveGate = new HintGate(claimIntervalMs / 4, () => trigger.fire());
  listener?.on(presenceChannel, hint, () => hintGate.take());
  const leftTag = leaveTag(opts.queue, opts.consumer);
  listener?.on(presenceChannel, leftTag, () => leaveGate.take());

  function slotChanged(change: SlotChange): void {
    if (!opts.onSlot) return;
    try {
      opts.onSlot(change);
    } catch (err) {
      onError(err);
    }
  }

  function start(slot: number, n: number, lease: q.Lease, at: number): void {
    const r = new SlotRunner(env, slot, n, lease, at, runners.get(slot)?.done);
    runners.set(slot, r);
    slotChanged({ kind: "claimed", slot, nslots: n, epoch: BigInt(lease.epoch) });
    void r.done.finally(() => {
      if (runners.get(slot) === r) runners.delete(slot);
      slotChanged({ kind: "ended", slot, nslots: n, epoch: BigInt(lease.epoch), fenced: r.fenced });
      trigger.fire();
    });
  }

  async function pass(): Promise<void> {
    await followResize();
    const n = nslots;
    const now = Date.now();
    const leases = await q.slotLeases(db, opts.queue, opts.consumer);
    const owners: (string | null)[] = Array.from({ length: n }, () => null);
    // A lease whose holder's session is gone is claimable soon: try it.
    for (const l of leases) if (l.slot < n && l.nslots === n && l.live && !l.holderGone) owners[l.slot] = l.owner;
    const running = new Map<number, boolean>();
    for (const [s, r] of runners) if (!r.fenced) running.set(s, r.releaseRequested);
    const hold = new Set<number>();
    for (const [s, until] of holdoff) {
      if (now < until) hold.add(s);
      else holdoff.delete(s);
    }
    const plan = makePlan({ self: worker, slots: n, maxActive: maxActive(), owners, running, peers, holdoff: hold, prevFree });
    for (const s of plan.release) {
      runners.get(s)?.requestRelease(true);
      holdoff.set(s, now + 2 * claimIntervalMs);
    }
    let owned = running.size - plan.release.length - [...running.values()].filter(Boolean).length;
    for (const s of plan.claim) {
      if (fetchCtl.signal.aborted || n !== nslots) return;
      const at = Date.now();
      const lease = await q.claimSlot(db, opts.queue, opts.consumer, s, worker, leaseTtlMs, null, env.session());
      if (lease === null) continue; // another worker was faster
      start(s, n, lease, at);
      owned++;
    }
    prevFree = plan.free;
    const mine = [...runners].filter(([, r]) => !r.releaseRequested && !r.fenced && r.nslots === n).map(([s]) => s).sort((a, b) => a - b);
    const heard = await q.announce(db, opts.queue, opts.consumer, worker, owned < plan.target, mine, presenceTtl);
    const next = new Map<string, boolean>();
    let news = false;
    for (const p of heard) {
      if (p.worker === worker) continue;
      if (left(p)) {
        if (peers.has(p.worker)) {
          news = true;
          // The slots held off for a hungry peer may have been released
          // for this one: they may be claimed again at once.
          holdoff.clear();
        }
        continue;
      }
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

  /**
   * After a graceful stop released every slot: announces that this worker
   * left (no slots, not hungry: see left) and hints the peers, so that they
   * take the released slots at once instead of counting this worker for a
   * presence TTL and leaving its slots unworked for one or two claim
   * passes. Best effort: a peer that misses it forgets this worker after
   * the TTL, as after a crash.
   */
  async function leave(): Promise<void> {
    const doing = `announcing the stop of ${where} to the other workers`;
    let late = false;
    const said = (async () => {
      await q.announce(db, opts.queue, opts.consumer, worker, false, [], presenceTtl);
      if (listener) await q.notify(db, presenceChannel, leftTag);
    })().then(
      () => true,
      (err) => {
        // After the bound, stop() has resolved and said why: an error
        // reported now would reach onError after the caller moved on.
        if (!late) onError(mapError(doing, err));
        return true;
      },
    );
    // Bounded: a stop while the database is unreachable does not wait on it.
    let t: NodeJS.Timeout | undefined;
    const done = await Promise.race([said, new Promise<boolean>((r) => (t = setTimeout(() => r(false), LEAVE_WAIT_MS)))]);
    clearTimeout(t);
    if (!done) {
      late = true;
      onError(new Error(`pgque: ${doing} did not finish within ${LEAVE_WAIT_MS} ms; unless it lands later, they count this worker until its presence expires`));
    }
  }

  let stopped: Promise<void> | null = null;
  async function finish(): Promise<void> {
    await coordinator;
    await Promise.all([...runners.values()].map((r) => r.done));
    clearInterval(keeper);
    hintGate.stop();
    leaveGate.stop();
    if (!killCtl.signal.aborted && runners.size === 0) await leave();
    await listener?.close();
  }

  let killed: Promise<void> | null = null;
  function kill(): Promise<void> {
    fetchCtl.abort();
    if (!killCtl.signal.aborted) {
      killCtl.abort(new WorkerKilledError());
      for (const r of runners.values()) r.abandon(killCtl.signal.reason);
    }
    stopped ??= finish();
    killed ??= giveUpLate(stopped);
    return killed;
  }

  /**
   * Waits for finish() at most ABANDON_WAIT_MS: a handler that ignores its
   * aborted signal must not hold a shutdown forever. What still runs then
   * is abandoned: its runner fetches, acknowledges and releases nothing
   * more (its signal is aborted and the pool stopped claiming, so no
   * handler starts in this process after it), workTx destroys its
   * connection, and finish() goes on in the background until it returns.
   */
  async function giveUpLate(finishing: Promise<void>): Promise<void> {
    let t: NodeJS.Timeout | undefined;
    const late = new Promise<boolean>((r) => (t = setTimeout(() => r(true), ABANDON_WAIT_MS)));
    const gaveUp = await Promise.race([finishing.then(() => false), late]);
    clearTimeout(t);
    if (!gaveUp) return;
    const running = [...runners.values()].flatMap((r) => r.running().map((eventId) => ({ slot: r.slot, eventId })));
    const err = new HandlersStillRunningError(running, ABANDON_WAIT_MS);
    abandonCtl.abort(err);
    onError(err);
    // The abandoned handlers may go on: their slots' leases keep their TTL
    // rather than end a sixth of it after the LISTEN session closes below
    // (design.md, "Dead holders"), bounded as the rest of kill() is.
    const stuck = [...runners.values()].filter((r) => r.running().length > 0);
    let u: NodeJS.Timeout | undefined;
    await Promise.race([Promise.all(stuck.map((r) => r.unbind())), new Promise((r) => (u = setTimeout(r, ABANDON_WAIT_MS)))]);
    clearTimeout(u);
    // What finish() would do last; it may still be waiting for the
    // coordinator or a runner, and then does it again (both are idempotent).
    clearInterval(keeper);
    hintGate.stop();
    leaveGate.stop();
    await listener?.close();
  }

  const ownedSlots = () => [...runners].filter(([, r]) => !r.fenced && r.nslots === nslots).map(([s]) => s).sort((a, b) => a - b);
  return {
    workerId: worker,
    ownedSlots,
    stats: () => ({ ...counters, errors, lastError, ownedSlots: ownedSlots() }),
    async stop(so: StopOptions = {}) {
      const timeoutMs = stopTimeout(so.timeoutMs);
      // After a kill, finish() may wait for an abandoned handler forever.
      if (so.graceful === false || killCtl.signal.aborted) return kill();
      fetchCtl.abort();
      for (const r of runners.values()) r.wake();
      stopped ??= finish();
      if (timeoutMs === undefined) return stopped;
      let t: NodeJS.Timeout | undefined;
      const timedOut = new Promise<boolean>((r) => (t = setTimeout(() => r(true), timeoutMs)));
      const late = await Promise.race([stopped.then(() => false), timedOut]);
      clearTimeout(t);
      if (late) await kill();
    },
    kill,
  };
}
