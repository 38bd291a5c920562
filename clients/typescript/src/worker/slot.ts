// The runner of one claimed slot, and the key lanes of its chunks.
//
// Loop: receive a chunk (acknowledging the previous clean one in the same
// statement) → split it by partition key into lanes (one per key; a lane
// runs its key's events one at a time in ev_id order, lanes run at once
// under the pool's concurrency limit) → settle: nack the failures, hold
// the keys still running, ack the chunk, in one transaction → repeat.
//
// A slow or hot key does not stall its slot: once all but a few lanes of a
// chunk are done and the rest have been in one handler for holdAfterMs, or
// have events left for BUSY_HOLD_FACTOR × holdAfterMs at their handlers'
// mean, or have kept the chunk open that long each in a handler, those
// keys are held (hold_keys_partitioned defers their unfinished events on
// the server) and the chunk is acknowledged; the held lanes go on from
// memory and each settles its key with settle_held_partitioned when done.
// Settles of held lanes and the chunk cycle share the slot's mutex, so a
// release never races a chunk received but not acknowledged.
//
// Fencing: a call refused for the lease (PQ085/PQ032/PQ035), a renewal
// that comes back empty, or the local lease timer aborts the slot's
// signal: handlers see it, nothing more is acknowledged or released, and
// the next owner receives the chunk again.

import { setMaxListeners } from "node:events";
import { checkout, type ConnectionSource, type Executor } from "../executor.js";
import { isPgqueError, mapError, sqlstateOf } from "../errors.js";
import { toMessage, type ChunkRow, type Message } from "./message.js";
import * as q from "./sql.js";
import { HandlerTimeoutError, LeaseLostError, reasonOf, RetryAfterError, DeadLetterError } from "./outcome.js";
import { Mutex, Semaphore, Wake, sleep } from "./sync.js";
import { CallSignal } from "./callsignal.js";
import type { ReceiveGather } from "./gather.js";

/**
 * How long a deferred acknowledgement waits for the slot's next wake-up
 * before it goes on its own: 100 ms. Not part of the package's API (index.ts
 * does not export it); a test may lengthen it to show that a wake-up, not
 * this bound, made a call.
 */
export const foldTuning = { ackFoldWaitMs: 100 };
/**
 * A chunk below batchSize whose payloads stay under this was not cut by the
 * server's byte budget per chunk (32 MiB), so it ended the slot's batch.
 */
const foldBytes = 1 << 20;

/** What the handler gets beside the message. */
export interface HandlerContext {
  /**
   * Aborted when the handler should give up: its timeout passed (reason a
   * HandlerTimeoutError), the slot's lease was lost (LeaseLostError), or
   * the worker was killed.
   */
  signal: AbortSignal;
  /**
   * Marks the event done for its slot inside the transaction open on conn,
   * fenced by the slot's lease (workTx calls it as the last statement
   * before COMMIT). Fails with code PQ038 when the event was completed
   * before, and with a lease error when the lease was lost.
   */
  completeIn(conn: Executor): Promise<void>;
}

/**
 * The key under which the context of a handler call carries the pool's
 * give-up signal: aborted when a hard stop stopped waiting for the handlers
 * still running (ABANDON_WAIT_MS after aborting them). Not part of the
 * package's API: workTx destroys the connection of a call it abandons.
 */
export const abandonedSignal: unique symbol = Symbol("pgque.abandoned");

/** A HandlerContext as the runner passes it, with the give-up signal. */
export type RunnerContext = HandlerContext & { readonly [abandonedSignal]?: AbortSignal };

export type Handler<P = unknown> = (msg: Message<P>, ctx: HandlerContext) => unknown | Promise<unknown>;

/** How one handler call ended, as the onHandled hook sees it. */
export interface HandleResult {
  /** What the handler threw (a timeout is a HandlerTimeoutError); undefined when it returned. */
  error: unknown;
  /** How long the handler ran. */
  durationMs: number;
  /**
   * What follows a throw: the retry delay asked for, or null when the
   * event is dead-lettered at once (deadLetter()). A retry past the
   * queue's max_retries is dead-lettered by the server instead.
   */
  retryInMs?: number | null;
}

/** Counters of one worker, read by Worker.stats(). */
export interface HandleCounters {
  handled: number;
  failed: number;
  running: number;
}

/** Everything a runner shares with its pool. */
export interface SlotEnv {
  db: ConnectionSource;
  queue: string;
  consumer: string;
  worker: string;
  batchSize: number;
  leaseTtlMs: number;
  pollIntervalMs: number;
  handlerTimeoutMs: number;
  holdAfterMs: number;
  maxHeldEvents: number;
  retryDelayMs: (retryCount: number) => number;
  handler: Handler;
  sem: Semaphore;
  /** Aborted by stop(): no more fetching. */
  fetch: AbortSignal;
  /** Aborted by kill(): abandon everything. */
  kill: AbortSignal;
  /** Aborted when kill() gave up waiting for the handlers still running. */
  abandoned: AbortSignal;
  policy: () => string;
  setPolicy: (p: string) => void;
  onError: (err: unknown) => void;
  /** The slot fenced itself (reason says why). */
  onFenced: (reason: LeaseLostError) => void;
  /** The consumer's N as the pool knows it now (it follows a resize). */
  currentSlots: () => number;
  /**
   * Whether err from a call on a slot of N nslots comes from a completed
   * resize: the server said so, or the consumer's N, read again, is
   * another one now.
   */
  slotCountChanged: (nslots: number, err: unknown) => Promise<boolean>;
  onHandled: ((msg: Message, r: HandleResult) => void) | undefined;
  counters: HandleCounters;
  /** The pid of the LISTEN session leases are bound to now, 0 for none (Listener.sessionPid). */
  session: () => number;
  /** Makes the receives of slots woken together one call (gather.ts); null without gatherReceives. */
  gather: ReceiveGather | null;
}

/**
 * A lease bound to a LISTEN session that ended is given up locally TTL/8
 * after the end, unless a renewal binds it to the new session first: a
 * claim may take it over TTL/6 after the claim first found the session
 * gone (design.md, "Dead holders"), and this process cannot tell a broken
 * connection from its own death as others see it.
 */
export const SESSION_CAP_DIV = 8;

/**
 * The last few lanes of a chunk that have kept it open for this many hold
 * times are held if each runs a handler, however fast each handler is: a
 * hot key's share of a chunk (hundreds of 5–20 ms events once it falls
 * behind) would otherwise keep its slot's other keys waiting as long.
 * Holding it at the hold time itself sent its events through the server
 * and back at every chunk, which cost it more than its neighbours gained
 * (docs/design.md, "Key lanes and holds").
 */
export const BUSY_HOLD_FACTOR = 10;

type Outcome = { ok: true } | { ok: false; failure: q.Failure };

/**
 * Whether a lane running a handler has events left that, at the mean of
 * its handlers so far (two at least), would keep its chunk open for
 * BUSY_HOLD_FACTOR hold times more: a hot key's share of a chunk, held
 * without waiting for it to have kept the chunk open that long.
 */
export function aheadOf(l: { runningSince: number | null; runs: number; ranMs: number; next: number; events: unknown[] }, holdMs: number): boolean {
  if (l.runningSince === null || l.runs < 2) return false;
  return (l.events.length - l.next) * (l.ranMs / l.runs) >= BUSY_HOLD_FACTOR * holdMs;
}

/** The events of one key in one chunk, handled one at a time. */
class Lane {
  /** Failures of this lane that its chunk settles (before any hold). */
  failures: q.Failure[] = [];
  /** Set when the key was held: the head event and what the lane did from it on. */
  heldFrom: string | null = null;
  heldDone: string[] = [];
  heldFailed: q.Failure[] = [];
  runningSince: number | null = null;
  runningId: string | null = null;
  /** The time the lane's handlers took, and how many ran: their mean tells how long the rest will take. */
  ranMs = 0;
  runs = 0;
  /** The index of the event the lane starts next (or runs now). */
  next = 0;
  /** The lane starts no more events (set before done resolves). */
  over = false;
  /** The lane stopped before its last event because its events are handed back. */
  cut = false;
  finished = false;
  readonly done: Promise<void>;

  constructor(readonly key: string | null, readonly events: Message[], run: (lane: Lane) => Promise<void>) {
    this.done = run(this).finally(() => {
      this.finished = true;
    });
  }
}

export class SlotRunner {
  private readonly ctl = new AbortController();
  /**
   * Aborted when the worker stops or the slot is to be given up: lanes
   * start no more events, and the events they have not run go back to the
   * server (waitLanesUntil holds their keys, the settle releases them in
   * order), so a stop waits for the handlers running, not for the chunk.
   */
  private readonly handBack = new AbortController();
  /** What a lane waiting for a place gives up on: one signal for all of them (see Semaphore). */
  private readonly laneSignal = AbortSignal.any([this.ctl.signal, this.handBack.signal]);
  /**
   * What the fetch loop's waits give up on: the pool's fetch signal or the
   * slot's. Made once (an AbortSignal.any costs about 12 µs, and the loop
   * waits at every wake-up); each wait removes its listener.
   */
  private readonly fetchOrAbort: AbortSignal;
  private readonly wakeUp = new Wake();
  private readonly mutex = new Mutex();
  private readonly held = new Set<Lane>();
  private heldEvents = 0;
  private heldChanged = new Wake();
  private pendingAck: q.Delivery | null = null;
  /** Every lane whose handlers may still run, held or not. */
  private readonly lanes = new Set<Lane>();
  /** The handler calls running, which an abort of the slot aborts. */
  private readonly calls = new Set<CallSignal>();
  /** Local time until which the lease is known to be held. */
  private leaseUntil: number;
  private renewing = false;
  /** The renewal in flight, which a release waits for. */
  private renewal: Promise<void> = Promise.resolve();
  /** Set when the runner gives the lease up: no renewal may take it again. */
  private releasing = false;
  /** Set while the session the lease is bound to has ended and no renewal bound it to another. */
  private capTimer: NodeJS.Timeout | null = null;
  releaseRequested = false;
  fenced = false;
  /** Set when a resize took the slot away: nothing more is acknowledged or released. */
  private resized = false;
  readonly done: Promise<void>;

  /**
   * prev is the previous runner of the slot in this process, fenced but
   * perhaps still waiting for a handler that ignores its signal: this one
   * receives nothing before it is gone, so that a key's next event never
   * starts while its previous handler still runs (G2). done resolves only
   * once every handler of the runner has returned, also after a fence or a
   * kill that left run() early.
   */
  constructor(private readonly env: SlotEnv, readonly slot: number, readonly nslots: number, private lease: q.Lease, claimedAt: number, prev?: Promise<void>) {
    this.leaseUntil = claimedAt + env.leaseTtlMs;
    this.fetchOrAbort = AbortSignal.any([env.fetch, this.ctl.signal]);
    // Every waiting lane listens on these: hundreds, in a chunk of a
    // backlog, past Node's default of ten that warns of a leak.
    setMaxListeners(0, this.ctl.signal, this.handBack.signal, this.laneSignal);
    this.ctl.signal.addEventListener("abort", () => {
      for (const c of this.calls) c.abort(this.ctl.signal.reason);
    }, { once: true });
    this.done = (prev ?? Promise.resolve())
      .then(() => this.run())
      .catch((err) => env.onError(err))
      .then(() => this.lanesDone())
      .finally(() => this.uncap());
    this.bound(lease.session);
  }

  /** The session the lease is bound to on the server, 0 for none. */
  get session(): number {
    return this.lease.session;
  }

  /**
   * Records that the lease is bound to session on the server: a lease
   * bound to the current session needs no early end; one bound to a
   * session that already ended gets it now (the pool's session watcher,
   * which caps the leases of an ending session, may have run before).
   */
  private bound(session: number): void {
    this.lease = { ...this.lease, session };
    if (session === 0 || session === this.env.session()) this.uncap();
    else this.cap();
  }

  /** The session the lease is bound to ended: give the slot up TTL/8 from now unless rebound. */
  cap(): void {
    if (this.capTimer || this.fenced) return;
    this.capTimer = setTimeout(() => {
      this.capTimer = null;
      this.fence("the LISTEN session the lease is bound to ended, and no renewal bound it to another in time");
    }, this.env.leaseTtlMs / SESSION_CAP_DIV);
    this.capTimer.unref();
  }

  private uncap(): void {
    if (this.capTimer) clearTimeout(this.capTimer);
    this.capTimer = null;
  }

  /** Resolves once no lane of this runner runs a handler or may start one. */
  private async lanesDone(): Promise<void> {
    while (this.lanes.size > 0) await Promise.allSettled([...this.lanes].map((l) => l.done));
  }

  /** The ids of the events whose handler runs now. */
  running(): string[] {
    return [...this.lanes].flatMap((l) => (l.runningId === null ? [] : [l.runningId]));
  }

  /** The signal handlers of this slot see. */
  get signal(): AbortSignal {
    return this.ctl.signal;
  }

  get epoch(): string {
    return this.lease.epoch;
  }

  wake(): void {
    this.wakeUp.fire();
  }

  /**
   * Asks the runner to give the slot up at its next chunk boundary; with
   * handBack (a slot given to another worker for fair share), handing back
   * the events its lanes have not started, as a stop does. A slot of an N
   * a resize replaced does not: its subscription is gone, and its chunk
   * cannot be settled anyway.
   */
  requestRelease(handBack = false): void {
    this.releaseRequested = true;
    if (handBack) this.handBack.abort();
    this.wakeUp.fire();
  }

  fence(why: string): void {
    if (this.fenced) return;
    this.fenced = true;
    const reason = new LeaseLostError(this.slot, why);
    this.ctl.abort(reason);
    this.wakeUp.fire();
    this.heldChanged.fire();
    this.env.onFenced(reason);
  }

  abandon(reason: unknown): void {
    if (!this.ctl.signal.aborted) this.ctl.abort(reason);
    this.wakeUp.fire();
    this.heldChanged.fire();
  }

  /**
   * Called by the pool's lease keeper every TTL/10: renews the lease with
   * claim_slot when less than 0.4·TTL is known to be left, and fences the
   * slot TTL/20 before its known end (the worker may be cut off from the
   * database; nobody else can take the slot over before the lease ends).
   */
  async keep(now: number): Promise<void> {
    const { env } = this;
    if (this.fenced || this.ctl.signal.aborted) return;
    if (now > this.leaseUntil - env.leaseTtlMs / 20) {
      this.fence("the lease could expire before it was renewed");
      return;
    }
    // A lease not bound to the current session is renewed to bind it: one
    // claimed before the session was confirmed, or bound to one replaced.
    const rebind = env.session() !== 0 && this.lease.session !== env.session();
    if (this.renewing || (this.leaseUntil - now >= 0.4 * env.leaseTtlMs && !rebind)) return;
    await this.renew();
  }

  /**
   * Unbinds the lease from the LISTEN session, best effort: the lease then
   * lasts its TTL whatever becomes of the session. The pool calls it for
   * the slots whose handlers a hard stop abandoned before it closes the
   * session, so that another worker does not get their keys while those
   * handlers may still run.
   */
  async unbind(): Promise<void> {
    const { env } = this;
    if (this.lease.session === 0) return;
    try {
      await q.claimSlot(env.db, env.queue, env.consumer, this.slot, env.worker, env.leaseTtlMs, this.lease.token, 0);
      this.lease = { ...this.lease, session: 0 };
    } catch {
      // The lease ends TTL/6 after the session does, as if the process had died.
    }
  }

  /** Renews the lease now, binding it to the current session (the pool calls it when a new one is up). */
  async renew(): Promise<void> {
    if (this.renewing || this.releasing || this.fenced || this.ctl.signal.aborted) return;
    this.renewing = true;
    this.renewal = this.renewOnce().finally(() => {
      this.renewing = false;
    });
    await this.renewal;
  }

  private async renewOnce(): Promise<void> {
    const { env } = this;
    const start = Date.now();
    const session = env.session();
    try {
      const l = await q.claimSlot(env.db, env.queue, env.consumer, this.slot, env.worker, env.leaseTtlMs, this.lease.token, session);
      if (l === null || l.epoch !== this.lease.epoch) {
        this.fence("the renewal found another owner");
        // The slot was free, so the renewal took it as a new lease that
        // this runner will not work: give it back rather than leave it
        // unworked for its TTL.
        if (l !== null) await q.releaseSlot(env.db, env.queue, env.consumer, this.slot, env.worker, l.token).catch(() => {});
      } else {
        this.renewed(start, env.leaseTtlMs);
        this.bound(session);
      }
    } catch (err) {
      if (isPgqueError(mapError("", err), "lease_lost")) this.fence("the renewal was refused");
      else if (!this.ctl.signal.aborted) env.onError(mapError(`renewing the lease on slot ${this.slot}`, err));
    }
  }

  /** A receive or ack that began at start proves the lease for half a TTL more. */
  private renewed(start: number, forMs: number): void {
    this.leaseUntil = Math.max(this.leaseUntil, start + forMs);
  }

  private stopping(): boolean {
    return this.env.fetch.aborted || this.releaseRequested || this.fenced || this.resized || this.ctl.signal.aborted;
  }

  /**
   * After a failed call: whether a completed resize took the slot away (its
   * subscription and lease went with the old N). The runner then leaves
   * without acknowledging or releasing anything; the pool claims the new
   * N's slots on its next pass.
   */
  private async leftByResize(err: unknown): Promise<boolean> {
    if (this.fenced || !(await this.env.slotCountChanged(this.nslots, err))) return false;
    this.resized = true;
    return true;
  }

  /** A SQL call as the lease holder: fences the slot when refused for the lease. */
  private async call<T>(doing: string, fn: () => Promise<T>): Promise<T> {
    const start = Date.now();
    try {
      const out = await fn();
      this.renewed(start, this.env.leaseTtlMs / 2);
      return out;
    } catch (err) {
      const e = mapError(`${doing} (slot ${this.slot})`, err);
      if (isPgqueError(e, "lease_lost")) this.fence(`${doing} was refused`);
      throw e;
    }
  }

  private async run(): Promise<void> {
    const onStop = () => this.handBack.abort();
    this.env.fetch.addEventListener("abort", onStop, { once: true });
    if (this.env.fetch.aborted) onStop();
    try {
      await this.runLoop();
    } finally {
      this.env.fetch.removeEventListener("abort", onStop);
    }
  }

  private async runLoop(): Promise<void> {
    const { env } = this;
    const a = this.lease;
    // A hold lives only as long as the runner that took it: whatever a
    // previous owner (or this process before a fencing) left is released
    // before the first receive.
    for (let attempt = 0; ; attempt++) {
      if (this.ctl.signal.aborted || env.kill.aborted) return;
      try {
        await this.call("releasing stale holds", () => q.releaseStaleHolds(env.db, env.queue, env.consumer, this.slot, this.nslots, env.worker, a.token));
        break;
      } catch (err) {
        if (this.fenced || (await this.leftByResize(err))) return;
        env.onError(err);
        await sleep(Math.min(5000, 100 * 2 ** attempt), this.ctl.signal);
      }
    }
    let failedReceives = 0;
    // Whether the slot waited for a wake-up since its last receive: then
    // its receive goes with those of the other slots woken at once.
    let waited = false;
    while (!this.stopping()) {
      let foldAck = false;
      if (this.heldEvents >= env.maxHeldEvents) {
        await this.heldChanged.wait(env.pollIntervalMs, this.ctl.signal, 0);
        continue;
      }
      const unlock = await this.mutex.lock();
      let settled = true;
      try {
        if (this.stopping()) break;
        let rows;
        try {
          const ack = this.pendingAck;
          rows = await this.call("receiving", () =>
            waited && env.gather
              ? env.gather.receive(this.slot, this.nslots, a.token, ack)
              : q.receive(env.db, env.queue, env.consumer, this.slot, this.nslots, env.worker, a.token, env.batchSize, ack));
          waited = false;
        } catch (err) {
          waited = false;
          if (this.fenced || (await this.leftByResize(err))) break;
          env.onError(err);
          failedReceives++;
          settled = false;
        }
        if (rows !== undefined) {
          failedReceives = 0;
          this.pendingAck = null;
          if (rows.length > 0) {
            if (String(rows[0]!.epoch) !== a.epoch) {
              this.fence(`the server delivered under epoch ${rows[0]!.epoch}, the lease is at ${a.epoch}`);
              break;
            }
            await this.chunk(rows.map((r) => toMessage(r, env.queue, env.consumer, this.slot, this.nslots)), {
              epoch: String(rows[0]!.epoch),
              batchId: String(rows[0]!.batch_id),
              msgId: String(rows[0]!.msg_id),
            });
            foldAck = this.endedBatch(rows);
            if (!foldAck) continue;
          }
        }
      } finally {
        unlock();
      }
      waited = true;
      // Nothing to do (or the database failed): wait for a tick, a poll, or a stop;
      // with an acknowledgement waiting to ride on the next receive, not longer
      // than foldTuning.ackFoldWaitMs.
      if (foldAck) {
        await this.wakeUp.wait(Math.min(foldTuning.ackFoldWaitMs, env.pollIntervalMs), this.fetchOrAbort, 0);
        continue;
      }
      const wait = settled ? env.pollIntervalMs : Math.min(env.pollIntervalMs * 2 ** failedReceives, 30_000);
      await this.wakeUp.wait(wait, this.fetchOrAbort, 0.2);
    }
    if (this.resized) {
      // Left by a resize: the cutover waited for every held key of the
      // slot, so nothing is held; whatever still runs finishes first.
      await Promise.all([...this.held].map((l) => l.done));
      await this.settlingDone();
      return;
    }
    if (this.fenced || this.ctl.signal.aborted) return;
    // Graceful end: acknowledge the last clean chunk, let the held lanes
    // finish and settle, give the lease up.
    if (this.pendingAck) {
      const d = this.pendingAck;
      this.pendingAck = null;
      try {
        await rerun(() => this.call("acknowledging the last chunk", () => q.ack(env.db, env.queue, env.consumer, this.slot, this.nslots, env.worker, a.token, d)), this.ctl.signal);
      } catch (err) {
        if (!this.fenced) env.onError(err);
      }
    }
    await Promise.all([...this.held].map((l) => l.done));
    await this.settlingDone();
    if (this.fenced || this.ctl.signal.aborted) return;
    // A slot of an N the consumer no longer has: its lease went with the
    // old subscription at the cutover (a lease row of the same number is
    // the new slot's), nothing to release.
    if (this.nslots !== env.currentSlots()) return;
    // No renewal after the release: one that came after it would take the
    // free lease again, and one in flight is waited for.
    this.releasing = true;
    await this.renewal;
    if (this.fenced) return;
    try {
      await q.releaseSlot(env.db, env.queue, env.consumer, this.slot, env.worker, a.token);
    } catch (err) {
      const e = mapError(`releasing slot ${this.slot}`, err);
      if (!isPgqueError(e, "lease_lost")) env.onError(e);
    }
  }

  /**
   * Whether the chunk just handled ended the slot's batch with its
   * acknowledgement deferred: then the next receive would only acknowledge it
   * and find nothing, so the slot waits for its next wake-up instead and the
   * acknowledgement rides on that receive (or goes after foldTuning.ackFoldWaitMs). A
   * chunk of batchSize, or one the server's byte budget per chunk may have
   * cut, may leave events of the batch: receive again at once. As the Go
   * pool's receiveAgain.
   */
  private endedBatch(rows: readonly Pick<ChunkRow, "payload" | "type" | "partition_key">[]): boolean {
    if (this.pendingAck === null || rows.length >= this.env.batchSize) return false;
    // The budget counts every text handed out: types and keys as payloads.
    let bytes = 0;
    for (const r of rows) bytes += (r.payload?.length ?? 0) + r.type.length + (r.partition_key?.length ?? 0);
    return bytes < foldBytes;
  }

  private settles = new Set<Promise<void>>();
  private async settlingDone(): Promise<void> {
    while (this.settles.size > 0) await Promise.all([...this.settles]);
  }


  /** Handles one chunk and settles it. Called under the slot's mutex. */
  private async chunk(msgs: Message[], d: q.Delivery): Promise<void> {
    const { env } = this;
    const pause = env.policy() === "pause";
    const byKey = new Map<string | null, Message[]>();
    for (const m of msgs) {
      const list = byKey.get(m.key);
      if (list) list.push(m);
      else byKey.set(m.key, [m]);
    }
    const lanes = [...byKey].map(([key, events]) => new Lane(key, events, (lane) => this.runLane(lane, pause)));
    for (const l of lanes) {
      this.lanes.add(l);
      void l.done.finally(() => this.lanes.delete(l)).catch(() => {});
    }
    const toHold = await this.waitLanes(lanes);
    if (this.ctl.signal.aborted) return;
    const failures = lanes.flatMap((l) => l.failures);
    // Failures in chunk order, as the Go pool nacks them.
    const order = new Map(msgs.map((m, i) => [m.id, i]));
    failures.sort((x, y) => order.get(x.id)! - order.get(y.id)!);
    if (failures.length === 0 && toHold.length === 0 && this.held.size === 0) {
      // Nothing to nack or hold: the next receive acknowledges the chunk.
      this.pendingAck = d;
      return;
    }
    try {
      await rerun(() => this.settleChunk(d, failures, toHold, pause), this.ctl.signal);
    } catch (err) {
      for (const l of toHold) this.unhold(l);
      if (this.fenced || this.ctl.signal.aborted) return;
      env.onError(err);
      if (toHold.length === 0) return; // not acknowledged: received again
      // The hold failed: fall back to the chunk barrier for this chunk.
      await Promise.all(lanes.map((l) => l.done));
      if (this.ctl.signal.aborted) return;
      // Lanes cut short by a stop left events unrun: not acknowledged, the
      // next owner receives the chunk again.
      if (lanes.some((l) => l.cut)) return;
      const all = lanes.flatMap((l) => l.failures).sort((x, y) => order.get(x.id)! - order.get(y.id)!);
      try {
        await rerun(() => this.settleChunk(d, all, [], pause), this.ctl.signal);
      } catch (err2) {
        if (!this.fenced) env.onError(err2);
      }
      return;
    }
    for (const l of toHold) {
      this.held.add(l);
      this.heldEvents += l.events.length;
      const p = l.done.then(() => this.settleLane(l, d.epoch)).finally(() => {
        this.held.delete(l);
        this.heldEvents -= l.events.length;
        this.settles.delete(p);
        this.heldChanged.fire();
      });
      this.settles.add(p);
    }
  }

  /** A hold that did not commit: the lane is an ordinary lane of its chunk again. */
  private unhold(l: Lane): void {
    l.failures.push(...l.heldFailed);
    l.heldFailed = [];
    l.heldDone = [];
    l.heldFrom = null;
  }

  /**
   * Waits until every lane is done, or until the stragglers should be held:
   * all but a few lanes (at most an eighth, at least one) are done and each
   * of the rest has been in one handler for holdAfterMs. Returns the lanes
   * to hold, their heads marked.
   */
  private async waitLanes(lanes: Lane[]): Promise<Lane[]> {
    const all = Promise.all(lanes.map((l) => l.done)).then(() => true);
    const few = Math.max(1, Math.floor(lanes.length / 8));
    const signals = [this.ctl.signal, this.handBack.signal];
    let onAbort = () => {};
    const aborted = new Promise<boolean>((r) => {
      onAbort = () => r(false);
      for (const s of signals) s.addEventListener("abort", onAbort, { once: true });
    });
    try {
      return await this.waitLanesUntil(lanes, all, few, aborted);
    } finally {
      for (const s of signals) s.removeEventListener("abort", onAbort);
    }
  }

  /**
   * waitLanes' loop; aborted resolves when the slot's signal or the hand
   * back aborts. Once the events are handed back, every lane not through
   * its events is held from the event it runs, or from the first it did not
   * start: the running handlers finish, and the settle of each key puts
   * the rest back in order for the next owner.
   */
  private async waitLanesUntil(lanes: Lane[], all: Promise<boolean>, few: number, aborted: Promise<boolean>): Promise<Lane[]> {
    const hold = this.env.holdAfterMs;
    /** When the lanes left open first were few. */
    let fewSince: number | null = null;
    for (;;) {
      if (this.ctl.signal.aborted) return [];
      if (this.handBack.signal.aborted) {
        const back: Lane[] = [];
        for (const l of lanes) {
          if (l.over && !l.cut) continue; // ran its events, or stopped on a failure under pause
          const from = l.runningId ?? l.events[l.next]?.id ?? null;
          if (from === null) continue; // past its last event: it ran them all
          l.heldFrom = from;
          back.push(l);
        }
        return back;
      }
      const now = Date.now();
      const open = lanes.filter((l) => !l.finished);
      if (open.length === 0) return [];
      if (open.length <= few) fewSince ??= now;
      // Held when each has been in one handler for the hold time, or has
      // events left for BUSY_HOLD_FACTOR hold times (aheadOf), or, once they
      // have kept the chunk open that long, when each is in a handler at
      // all: a hot key's many fast events.
      const busyAt = fewSince === null ? Infinity : fewSince + BUSY_HOLD_FACTOR * hold;
      if (open.length <= few && open.every((l) => l.runningSince !== null && (now >= busyAt || now - l.runningSince >= hold || aheadOf(l, hold)))) {
        for (const l of open) l.heldFrom = l.runningId;
        return open;
      }
      const next = open.length <= few
        ? Math.max(1, Math.min(busyAt - now, ...open.map((l) => (l.runningSince === null ? hold : l.runningSince + hold - now))))
        : hold;
      // A timer cleared when the lanes finish first: a chunk of quick
      // handlers would otherwise leave a timer and an abort listener
      // behind for every chunk.
      let t: NodeJS.Timeout | undefined;
      const timer = new Promise<boolean>((r) => (t = setTimeout(() => r(false), next)));
      const done = await Promise.race([all, timer, aborted]);
      clearTimeout(t);
      if (done) return [];
    }
  }

  /**
   * Runs a lane's events one after another under one place of the
   * process's semaphore, taken for its first event and kept until the
   * lane ends. Giving the place back after each event sent the lane to
   * the back of the semaphore's queue: with hundreds of keys' lanes
   * waiting (a backlog being caught up), a hot key ran one event per turn
   * of all of them, a few events a second, and its chunk, which ends
   * with its longest lane, took as long.
   */
  private async runLane(lane: Lane, pause: boolean): Promise<void> {
    const { env } = this;
    let placed = false;
    const handedBack = () => {
      if (!this.handBack.signal.aborted) return false;
      lane.cut = true;
      return true;
    };
    try {
      for (let i = 0; i < lane.events.length; i++) {
        const m = lane.events[i]!;
        lane.next = i;
        if (this.ctl.signal.aborted || handedBack()) return;
        if (!placed && !env.sem.tryAcquire()) {
          try {
            await env.sem.acquire(this.laneSignal);
          } catch {
            handedBack();
            return;
          }
        }
        placed = true;
        // Nothing between this test and runningId below awaits: once the
        // hand back is seen, no lane starts another event.
        if (handedBack()) return;
        let out: Outcome;
        try {
          lane.runningId = m.id;
          lane.runningSince = Date.now();
          out = await this.invoke(m);
        } finally {
          lane.ranMs += Date.now() - lane.runningSince!;
          lane.runs++;
          lane.runningSince = null;
          lane.runningId = null;
        }
        if (this.ctl.signal.aborted) return;
        // In the same step as the handler's end (no await between): a hand
        // back never holds the key from an event that ran.
        lane.next = i + 1;
        const heldNow = lane.heldFrom !== null && BigInt(m.id) >= BigInt(lane.heldFrom);
        if (out.ok) {
          if (heldNow) lane.heldDone.push(m.id);
          continue;
        }
        if (heldNow) lane.heldFailed.push(out.failure);
        else lane.failures.push(out.failure);
        // Under pause the key's later events wait for the failed one's retry
        // (the nack or the settle defers them on the server).
        if (pause) return;
      }
    } finally {
      lane.over = true;
      if (placed) env.sem.release();
    }
  }

  /**
   * Runs the handler on m with its timeout and the slot's signal. Each call
   * gets a signal of its own, made when the handler reads it (CallSignal):
   * listeners a handler adds to it go with the event instead of piling up
   * on the slot's.
   */
  private async invoke(m: Message): Promise<Outcome> {
    const { env } = this;
    const began = performance.now();
    const call = new CallSignal(began, env.handlerTimeoutMs);
    if (this.ctl.signal.aborted) call.abort(this.ctl.signal.reason);
    this.calls.add(call);
    let out: Outcome;
    let error: unknown;
    env.counters.running++;
    try {
      const token = this.lease.token;
      const completeIn = (conn: Executor) =>
        q.completeInTx(conn, env.queue, env.consumer, this.slot, this.nslots, env.worker, token, m.epoch, m.batchId, m.id);
      // An own getter, which a handler's `{ ...ctx }` copies as the
      // signal (a class's getter on its prototype, 1.5 µs cheaper to
      // make, would leave the copy without one).
      const ctx: RunnerContext = {
        get signal() {
          return call.signal;
        },
        completeIn,
        [abandonedSignal]: env.abandoned,
      };
      await env.handler(m, ctx);
      out = { ok: true };
    } catch (err) {
      // A throw of undefined or null fails the event too: onHandled's
      // error says so rather than reading as a success.
      error = err ?? new Error(`the handler threw ${String(err)}`);
      let timedOut = false;
      let delayMs: number | null;
      try {
        timedOut = call.timedOut() && !(err instanceof HandlerTimeoutError);
        delayMs = this.delayOf(error, m.retryCount);
      } catch {
        // instanceof itself throws on a revoked Proxy: what the handler
        // threw cannot be inspected, so it gets the default retry. Nothing
        // here may throw: the runner would end with its chunk unsettled,
        // and the chunk would run again, good events and all, after every
        // lease TTL.
        delayMs = defaultRetryDelay(m.retryCount);
      }
      if (timedOut) {
        error = new HandlerTimeoutError(env.handlerTimeoutMs);
        (error as Error).cause = err;
        delayMs = this.delayOf(error, m.retryCount);
      }
      out = { ok: false, failure: { id: m.id, delayMs, reason: reasonOf(error) } };
    } finally {
      call.end();
      this.calls.delete(call);
      env.counters.running--;
    }
    if (out.ok) env.counters.handled++;
    else env.counters.failed++;
    if (env.onHandled) {
      const r: HandleResult = { error, durationMs: performance.now() - began };
      if (!out.ok) r.retryInMs = out.failure.delayMs;
      try {
        env.onHandled(m, r);
      } catch (err) {
        env.onError(err);
      }
    }
    return out;
  }

  /** null dead-letters at once; else the delay before the retry. */
  private delayOf(err: unknown, retryCount: number): number | null {
    if (err instanceof DeadLetterError) return null;
    if (err instanceof RetryAfterError) return err.delayMs;
    try {
      const d = this.env.retryDelayMs(retryCount);
      return Number.isFinite(d) && d > 0 ? d : 0;
    } catch {
      return defaultRetryDelay(retryCount);
    }
  }

  /**
   * Nacks the failures, holds the keys still running and acks the chunk,
   * in one transaction. With failures, the failure policy is read again
   * inside it (before the nacks and before the ack): a chunk handled under
   * a policy an operator has changed since is not settled but received and
   * handled again, since a chunk handled under pause and acked under skip
   * would lose the events held back.
   */
  private async settleChunk(d: q.Delivery, failures: q.Failure[], hold: Lane[], pause: boolean): Promise<void> {
    const { env } = this;
    const a = this.lease;
    const conn = await checkout(env.db);
    let broken = false;
    try {
      await conn.query("begin");
      const check = async (tx: Executor) => {
        if (failures.length === 0) return;
        const p = await q.slotPolicy(tx, env.queue, env.consumer);
        if (p !== null && (p === "pause") !== pause) {
          env.setPolicy(p);
          throw new Error(`the failure policy changed to ${p} while slot ${this.slot} handled its chunk; it is handled again`);
        }
      };
      await this.call("settling the chunk", async () => {
        await check(conn);
        for (const f of failures) await q.nack(conn, env.queue, env.consumer, this.slot, this.nslots, env.worker, a.token, d, f);
        if (hold.length > 0) {
          await q.holdKeys(conn, env.queue, env.consumer, this.slot, this.nslots, env.worker, a.token, d, hold.map((l) => l.key), hold.map((l) => l.heldFrom!));
        }
        await check(conn);
        await q.ack(conn, env.queue, env.consumer, this.slot, this.nslots, env.worker, a.token, d);
        await conn.query("commit");
      });
    } catch (err) {
      await conn.query("rollback").catch(() => {
        broken = true;
      });
      throw err;
    } finally {
      conn.release(broken);
    }
  }

  /** A held lane finished: settle its key, under the slot's mutex. */
  private async settleLane(l: Lane, epoch: string): Promise<void> {
    const { env } = this;
    if (this.ctl.signal.aborted) return;
    // Handed back before it ran anything since the hold: the slot's next
    // owner releases it (release_stale_holds_partitioned, one call for
    // every such key instead of a settlement each).
    if (l.cut && l.heldDone.length === 0 && l.heldFailed.length === 0) return;
    for (let attempt = 0; attempt < 5; attempt++) {
      const unlock = await this.mutex.lock();
      try {
        if (this.ctl.signal.aborted) return;
        await this.call("settling a held key", () =>
          q.settleHeld(env.db, env.queue, env.consumer, this.slot, this.nslots, env.worker, this.lease.token, epoch, l.key, l.heldFrom!, l.heldDone, l.heldFailed));
        return;
      } catch (err) {
        if (this.fenced) return;
        env.onError(err);
      } finally {
        unlock();
      }
      await sleep(100 * 2 ** attempt, this.ctl.signal);
    }
    // The hold cannot be settled: give the slot up, so that its next owner
    // releases the hold (at-least-once for the key's held events).
    this.fence("a held key could not be settled");
  }
}

/** 1 s doubled per retry, capped at 10 min, ±10% jitter: the Go default. */
export function defaultRetryDelay(retryCount: number): number {
  const base = Math.min(600_000, 1000 * 2 ** Math.min(Math.max(retryCount, 0), 30));
  return base * (0.9 + 0.2 * Math.random());
}

/** How many times rerun runs a settling transaction in all. */
const SETTLE_RUNS = 3;

/**
 * Runs settle, a settling transaction of its own, again when the server
 * rolled it back as a deadlock victim (40P01) or a serialization failure
 * (40001), at most SETTLE_RUNS times in all, 10 then 20 ms apart. Nothing
 * of it was committed and its fencing still proves the chunk, while a
 * chunk left unsettled is delivered again although its handlers ran:
 * another session's locks must not cost duplicates.
 */
async function rerun<T>(settle: () => Promise<T>, signal: AbortSignal): Promise<T> {
  for (let run = 1; ; run++) {
    try {
      return await settle();
    } catch (err) {
      const code = sqlstateOf(err);
      if (run >= SETTLE_RUNS || (code !== "40P01" && code !== "40001") || signal.aborted) throw err;
    }
    await sleep(10 * 2 ** (run - 1), signal);
  }
}
