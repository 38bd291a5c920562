// Transactional handlers: the handler's writes and the event's completion
// commit in one transaction on the consumer's own database, so each event's
// effects are applied exactly once across crashes, takeovers and retries.
//
// The design is the SQL one (docs/design.md, "Transactional handlers"):
// complete_partitioned_in_tx appends a done record for (slot, event) in the
// handler's transaction, fenced by the slot's lease. A chunk whose
// acknowledgement was lost is delivered again; its completed events run
// their handler again, the completion finds the record (PQ038), the
// transaction rolls back, and the event counts as handled. A failed attempt
// rolls back with its writes, then retries or dead-letters as usual.

import { checkout, isPool, type ConnectionSource, type PooledConnection } from "../executor.js";
import { sqlstateOf } from "../errors.js";
import type { Message } from "./message.js";
import { work, type WorkOptions, type Worker } from "./pool.js";
import { abandonedSignal, type HandlerContext, type RunnerContext } from "./slot.js";

/**
 * A transactional handler: tx is a connection inside an open transaction
 * (BEGIN has run); write the event's effects through it and return. The
 * library completes the event in the same transaction and commits; a throw
 * rolls everything back.
 */
export type TxHandler<P = unknown> = (msg: Message<P>, tx: PooledConnection, ctx: { signal: AbortSignal }) => unknown | Promise<unknown>;

/**
 * What to run when each pool's abandon signal aborts: the destroys of the
 * workTx calls running under it. One listener per pool, not one per call,
 * which would pile up on the long-lived signal (and warn past ten), nor
 * an AbortSignal.any per call, about 12 µs each.
 */
const abandonHooks = new WeakMap<AbortSignal, Set<() => void>>();

/** Runs fn when abandoned aborts, until the function returned is called. */
function whenAbandoned(abandoned: AbortSignal, fn: () => void): () => void {
  let hooks = abandonHooks.get(abandoned);
  if (hooks === undefined) {
    const set = new Set<() => void>();
    abandonHooks.set(abandoned, set);
    abandoned.addEventListener("abort", () => {
      for (const f of set) f();
      set.clear();
    }, { once: true });
    hooks = set;
  }
  const own = hooks;
  own.add(fn);
  return () => {
    own.delete(fn);
  };
}

/** The SQLSTATE of a completion that finds its event completed before. */
const ALREADY_COMPLETED = "PQ038";
/** A statement in a transaction a failed statement aborted. */
const IN_FAILED_TRANSACTION = "25P02";
/** A statement's lock timeout. */
const LOCK_TIMEOUT = "55P03";
/** How often workTx runs a handler whose completion timed out waiting for its lock, as the Go client. */
const COMPLETION_ATTEMPTS = 3;

/**
 * Fails the attempt when the handler left no open transaction to complete
 * the event in: a COMMIT or ROLLBACK run on tx would otherwise let the
 * completion commit on its own, the event done and its effects committed
 * apart from it, or rolled back and lost. Read from the status of the
 * connection's last ReadyForQuery (node-postgres sets it before a query
 * that succeeded resolves); a connection that does not tell is not checked.
 */
function checkOpen(tx: PooledConnection): void {
  const status = (tx as { getTransactionStatus?: () => string | null }).getTransactionStatus?.();
  if (status === "I") {
    throw new Error("workTx: the handler ended its transaction (COMMIT or ROLLBACK on tx), so the event cannot be completed with its writes; write through tx and return, or throw to roll back");
  }
}

/** Connections of a pg.Pool a transactional worker leaves to everything but its handlers, at least. */
export const TX_SPARE_CONNECTIONS = 2;

/**
 * The connections of a pg.Pool of max connections that a transactional
 * worker of a consumer with nslots slots leaves to everything but its
 * handlers: TX_SPARE_CONNECTIONS and one per two slots (each slot's runner
 * makes its receives, acknowledgements, holds and settles one at a time),
 * at most half the pool.
 */
export function txSpare(max: number, nslots: number): number {
  return Math.max(TX_SPARE_CONNECTIONS, Math.min(TX_SPARE_CONNECTIONS + Math.ceil(nslots / 2), Math.floor(max / 2)));
}

/**
 * The handlers a transactional worker runs at once when its options do not
 * say: its pg.Pool's max less txSpare, at least 1. Each running handler
 * holds a connection for its whole transaction, and the pool queues every
 * checkout first come, first served: with more handlers than connections,
 * the worker's lease renewals, receives and acknowledgements, and the
 * application's sends on the same pool, waited behind every handler queued
 * before them — long enough for slots to be fenced (their leases ran out)
 * and for sends to take tens of seconds. With only 2 connections spare for
 * 16 slots' calls, the slots' receives and settles still queued behind the
 * handlers: at 500 keyed events/s with 5-50 ms handlers on a pool of 40, a
 * hot key's next event started 15 ms after its last commit (p50) and its
 * events waited 1.4-1.7 s, against 9.5 ms and 0.58 s with 10 spare (38
 * handlers on a pool of 48, or 30 on 40). A pool that does not tell its
 * max gets work()'s default.
 */
function txConcurrency(db: ConnectionSource, nslots: number): number | undefined {
  const max = (db as { options?: { max?: unknown } }).options?.max;
  if (!isPool(db) || typeof max !== "number" || !Number.isFinite(max)) return undefined;
  return Math.max(1, Math.floor(max) - txSpare(Math.floor(max), nslots));
}

/**
 * work() with a transactional handler: for each event the worker checks a
 * connection out of db, begins a transaction, runs handler on it, completes
 * the event in it (complete_partitioned_in_tx) and commits. db must be a
 * pool on the database pgque is installed in. Unless opts.concurrency says
 * otherwise, at most the pool's max less txSpare handlers run at once
 * (txConcurrency).
 */
export function workTx<P = unknown>(db: ConnectionSource, opts: WorkOptions<P>, handler: TxHandler<P>): Promise<Worker> {
  const concurrency = opts.concurrency ?? txConcurrency(db, opts.slots);
  return work<P>(db, { ...opts, concurrency }, async (msg: Message<P>, ctx: HandlerContext) => {
    const abandoned = (ctx as RunnerContext)[abandonedSignal];
    for (let attempt = 1; ; attempt++) {
      const tx = await checkout(db);
      // The wait for a connection takes no signal: a stop, a lost lease or
      // the timeout may have come meanwhile, and the handler must not
      // start (and commit) after it.
      if (ctx.signal.aborted) {
        tx.release();
        throw ctx.signal.reason;
      }
      let broken = false;
      let completing = false;
      // A hard stop that gave up on this handler (it ignores its signal)
      // destroys the connection rather than leave it checked out: the
      // server rolls the transaction back, pool.end() does not wait for
      // it, and the handler's next statement fails. The connection is
      // then gone: nothing below may complete, commit or release it.
      let destroyed = false;
      const destroy = () => {
        destroyed = true;
        tx.release(abandoned!.reason as Error);
      };
      if (abandoned?.aborted) {
        tx.release();
        throw abandoned.reason;
      }
      const forget = abandoned ? whenAbandoned(abandoned, destroy) : () => {};
      try {
        await tx.query("begin");
        await handler(msg, tx, { signal: ctx.signal });
        if (destroyed) throw abandoned!.reason;
        checkOpen(tx);
        completing = true;
        await ctx.completeIn(tx);
        completing = false;
        await tx.query("commit");
        return;
      } catch (err) {
        if (destroyed) throw abandoned!.reason;
        // A connection whose COMMIT failed is not reused: the outcome of
        // the transaction is unknown to it.
        await tx.query("rollback").catch(() => {
          broken = true;
        });
        if (sqlstateOf(err) === ALREADY_COMPLETED) return; // done before: handled
        // The completion waited out its lock timeout (the lease row was
        // held by a claim in progress): not the
        // handler's failure, which would count a retry; run it again.
        if (completing && sqlstateOf(err) === LOCK_TIMEOUT && attempt < COMPLETION_ATTEMPTS && !ctx.signal.aborted) continue;
        // A statement of the handler failed, its error caught, and the
        // handler returned: PostgreSQL's own error does not say so.
        if (completing && sqlstateOf(err) === IN_FAILED_TRANSACTION) {
          throw new Error("workTx: a statement of the handler failed and the handler went on: its transaction is aborted, so the event cannot be completed; let the error propagate, or roll back to a savepoint", { cause: err });
        }
        throw err;
      } finally {
        forget();
        if (!destroyed) tx.release(broken);
      }
    }
  });
}
