// Coalescing sends made on a pool.
//
// A send is one PL/pgSQL call that costs the server about as much as the
// INSERT it makes, while send_batch pays that call once for a whole array
// (docs/design.md, "The floor of a function send"). So, as the Go client's
// Client.Send does, send on a pool keeps at most `concurrency` statements
// running; a send that finds them all busy waits, and when one finishes,
// everything that waited for the same queue goes out in one send_batch
// statement (of mixed types, in arrival order). A send that finds a
// statement free runs at once: an idle or lightly loaded pool adds no
// latency, and batches form only when sends arrive faster than statements
// return.
//
// Two rules keep one stuck statement from holding up the rest, as in Go.
// Sends with a dedup key are never coalesced (they wait on their key's lock,
// which an open transaction that sent the same key holds). And a send that
// has waited `patienceMs` without getting a statement runs its own, while
// fewer than `concurrency` such sends run: past that, what holds the sends
// up is the pool or the server, not one statement, and a statement per send
// would only lengthen the pool's queue (a thousand waiters were seen with
// one send each), so the rest stay to be coalesced.
//
// A batch the server refuses for what one of its events holds is sent again
// event by event, so that each send gets its own outcome and no good event
// fails for a bad neighbour. Any other error (a missing queue, a
// permission, a lost connection, whose outcome is unknown) is given to all.
//
// Sends of one partition key keep the order they were made in, awaited or
// not: a keyed send does not start a statement while an earlier send of its
// key and queue is in one that has not returned (nor run alone past its
// patience while one is), and goes with a later statement instead; within a
// statement events are stored in array order. Without that, two sends of a
// key made one after the other without await ran on two connections at once
// and could be stored, and delivered, the other way round. Sends with a
// dedup key and sends on a connection you hold do not come here.

import type { Executor } from "./executor.js";
import { sqlstateOf } from "./errors.js";
import type { Encoded } from "./event.js";
import { sendEncoded, sendOne } from "./producer.js";

/** Tuning of a pool's coalesced sends. */
export interface SendQueueOptions {
  /** Statements kept running at most; default 4. */
  concurrency?: number;
  /** How long a send waits for a statement before running its own; default 100 ms. */
  patienceMs?: number;
}

export const SEND_CONCURRENCY_DEFAULT = 4;
export const SEND_PATIENCE_MS_DEFAULT = 100;
/** Events one coalesced statement carries at most. */
const SEND_BATCH_MAX = 1000;
/**
 * Payload bytes (UTF-16 code units, close enough) one coalesced statement
 * carries at most; a larger payload goes alone.
 */
const SEND_BATCH_BYTES = 4 << 20;

interface Request {
  queue: string;
  ev: Encoded;
  /** The queue and partition key whose order the send keeps; null without a key. */
  order: string | null;
  state: "waiting" | "taken" | "abandoned";
  timer?: ReturnType<typeof setTimeout>;
  resolve(id: string): void;
  reject(err: unknown): void;
}

/** Counters for tests and measurements. */
export interface SendQueueStats {
  /** Statements that carried more than one coalesced send. */
  statements: number;
  /** Sends those statements carried. */
  batched: number;
  /** Sends that ran their own statement after patienceMs (at most concurrency at once). */
  bypassed: number;
  /** Sends sent again one by one after their batch failed. */
  alone: number;
}

/** Coalesces the sends made on one pool. */
export class SendQueue {
  readonly stats: SendQueueStats = { statements: 0, batched: 0, bypassed: 0, alone: 0 };
  private inflight = 0;
  /** Sends running their own statement after patienceMs (at most limit). */
  private bypassing = 0;
  private pending: Request[] = [];
  /** Sends in statements not yet returned, per order key (Request.order). */
  private running = new Map<string, number>();
  private readonly limit: number;
  private readonly patienceMs: number;

  constructor(private readonly exec: Executor, opts: SendQueueOptions = {}) {
    this.limit = opts.concurrency ?? SEND_CONCURRENCY_DEFAULT;
    this.patienceMs = opts.patienceMs ?? SEND_PATIENCE_MS_DEFAULT;
    if (!(Number.isInteger(this.limit) || this.limit === Infinity) || this.limit < 1) {
      throw new RangeError(`pgque: send concurrency must be a positive integer, got ${opts.concurrency}`);
    }
  }

  /**
   * Sends ev now if a statement is free (and no earlier send of its key is
   * in one), else waits to be coalesced.
   */
  send(queue: string, ev: Encoded): Promise<string> {
    return new Promise<string>((resolve, reject) => {
      const order = ev.key === null ? null : `${queue}\u0000${ev.key}`;
      const r: Request = { queue, ev, order, state: "waiting", resolve, reject };
      const impatient = () => {
        if (r.state !== "waiting") return;
        if (this.bypassing >= this.limit || this.keyAhead(r)) {
          r.timer = setTimeout(impatient, this.patienceMs);
          return;
        }
        r.state = "abandoned";
        this.bypassing++;
        this.stats.bypassed++;
        this.begin([r]);
        sendOne(this.exec, queue, ev)
          .then(resolve, reject)
          .finally(() => {
            this.bypassing--;
            this.end([r]);
            this.kick();
          });
      };
      this.pending.push(r);
      this.kick();
      if (r.state === "waiting") r.timer = setTimeout(impatient, this.patienceMs);
    });
  }

  /** Starts statements for the waiting sends while fewer than the limit run. */
  private kick(): void {
    while (this.inflight < this.limit) {
      const batch = this.take();
      if (batch === undefined) return;
      this.inflight++;
      void this.drain(batch);
    }
  }

  /** Sends batches until none can go; it holds one statement. */
  private async drain(first: Request[]): Promise<void> {
    for (let batch: Request[] | undefined = first; batch !== undefined; batch = this.take()) {
      await this.flush(batch);
    }
    this.inflight--;
  }

  /** Whether a send of r's key made before r is running or waiting. */
  private keyAhead(r: Request): boolean {
    if (r.order === null) return false;
    if (this.running.has(r.order)) return true;
    for (const o of this.pending) {
      if (o === r) return false;
      if (o.state === "waiting" && o.order === r.order) return true;
    }
    return false;
  }

  /** Counts the requests' keys as running in a statement. */
  private begin(batch: Request[]): void {
    for (const r of batch) {
      if (r.order !== null) this.running.set(r.order, (this.running.get(r.order) ?? 0) + 1);
    }
  }

  /** Counts the requests' keys as returned. */
  private end(batch: Request[]): void {
    for (const r of batch) {
      if (r.order === null) continue;
      const n = this.running.get(r.order)! - 1;
      if (n === 0) this.running.delete(r.order);
      else this.running.set(r.order, n);
    }
  }

  /**
   * Removes and returns the next statement's requests: the oldest waiting
   * one and every later one for the same queue, within SEND_BATCH_MAX
   * events and SEND_BATCH_BYTES of payload (the first always goes), but
   * none whose key has an earlier send running in another statement or
   * left waiting here.
   */
  private take(): Request[] | undefined {
    const batch: Request[] = [];
    const kept: Request[] = [];
    const held = new Set<string>();
    let bytes = 0;
    for (const r of this.pending) {
      if (r.state !== "waiting") continue;
      if (r.order !== null && (held.has(r.order) || this.running.has(r.order))) {
        held.add(r.order);
        kept.push(r);
        continue;
      }
      const head = batch[0];
      const fits = head === undefined
        || (r.queue === head.queue && batch.length < SEND_BATCH_MAX && bytes + r.ev.payload.length <= SEND_BATCH_BYTES);
      if (fits) {
        r.state = "taken";
        clearTimeout(r.timer);
        batch.push(r);
        bytes += r.ev.payload.length;
      } else {
        if (r.order !== null) held.add(r.order);
        kept.push(r);
      }
    }
    this.pending = kept;
    if (batch.length === 0) return undefined;
    this.begin(batch);
    return batch;
  }

  /** Sends batch in one statement and settles each request. */
  private async flush(batch: Request[]): Promise<void> {
    try {
      await this.flushOnce(batch);
    } finally {
      this.end(batch);
    }
  }

  private async flushOnce(batch: Request[]): Promise<void> {
    const head = batch[0]!;
    if (batch.length === 1) {
      await sendOne(this.exec, head.queue, head.ev).then(head.resolve, head.reject);
      return;
    }
    this.stats.statements++;
    this.stats.batched += batch.length;
    let ids: string[];
    try {
      ids = await sendEncoded(this.exec, head.queue, batch.map((r) => r.ev));
    } catch (err) {
      const code = sqlstateOf((err as { cause?: unknown }).cause ?? err);
      if (code === undefined || !eventError(code)) {
        for (const r of batch) r.reject(err);
        return;
      }
      this.stats.alone += batch.length;
      for (const r of batch) await sendOne(this.exec, r.queue, r.ev).then(r.resolve, r.reject);
      return;
    }
    batch.forEach((r, i) => r.resolve(ids[i]!));
  }
}

/**
 * Whether a send's SQLSTATE can come from what one event holds (its
 * payload, type or key: data exceptions 22, integrity 23, limits 54,
 * pgque's argument errors) rather than from the queue, role or server.
 */
export function eventError(code: string): boolean {
  if (code === "PQ001") return false; // queue not found
  if (code.startsWith("PQ")) return true;
  return ["22", "23", "54"].includes(code.slice(0, 2));
}

const queues = new WeakMap<object, SendQueue>();

/** The SendQueue of pool, made with default options on first use. */
export function coalescerFor(pool: Executor): SendQueue {
  let q = queues.get(pool);
  if (q === undefined) {
    q = new SendQueue(pool);
    queues.set(pool, q);
  }
  return q;
}

/**
 * Sets how sends on pool coalesce (call before the first send on it);
 * `{ concurrency: Infinity }` turns coalescing off.
 * Returns the pool's SendQueue, whose stats count what it did.
 */
export function configureSends(pool: Executor, opts: SendQueueOptions): SendQueue {
  const q = new SendQueue(pool, opts);
  queues.set(pool, q);
  return q;
}
