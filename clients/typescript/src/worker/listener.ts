// LISTEN wake-ups on one dedicated connection.
//
// The ticker NOTIFYs channel `pgque` with a tag of the queue's name after
// each tick, and `pgque_slots` with the same tag followed by the slots the
// tick touched (see parseTouched); pools NOTIFY `pgque_workers` with a tag
// of (queue, consumer) after announcing themselves. Payloads are only hints: anyone
// may NOTIFY, so a payload never carries data the pool trusts, it only
// makes a loop look earlier. When the connection breaks, the listener
// reconnects with jittered exponential backoff and, once back, wakes every
// subscriber (notifications sent meanwhile were lost). Polling stays the
// fallback in every loop.

import { createHash, randomBytes } from "node:crypto";
import pg from "pg";
import { isPool, type Executor } from "../executor.js";

export const tickChannel = "pgque";
export const slotsChannel = "pgque_slots";
export const presenceChannel = "pgque_workers";
/** The listener's own test of its connection (Listener.probe). */
export const probeChannel = "pgque_probe";

/** How long a probe waits for its notification, once sent, before it warns. */
export const PROBE_WAIT_MS = 3000;

/**
 * Passed to onError when the LISTEN connection does not get a notification
 * the worker sent it through the pool within PROBE_WAIT_MS of its commit:
 * notifications do not reach it, so the loops fall back to their polls (a
 * wake-up a poll interval late instead of at the tick). A transaction pooler (PgBouncer
 * in transaction mode) does this: a LISTEN holds for the server connection
 * of one transaction, and notifications that arrive while no client is
 * linked to it are dropped. Give the listener a direct or session-pooled
 * connection (the listen option), or pass listen: false to poll without
 * this warning.
 */
export class ListenNotDeliveringError extends Error {
  constructor(readonly waitedMs: number) {
    super(
      `the LISTEN connection did not receive a notification within ${waitedMs} ms of its commit: wake-ups do not arrive, ` +
        "so each loop waits for its poll (behind a transaction pooler such as PgBouncer in transaction mode, " +
        "give listen a direct or session-mode connection, or pass listen: false)",
    );
    this.name = "ListenNotDeliveringError";
  }
}

/** sha256('tick:' || queue), 16 hex digits: pgque._tick_tag. */
export function tickTag(queue: string): string {
  return createHash("sha256").update("tick:" + queue).digest("hex").slice(0, 16);
}

/** The Go pool's presence hint for (queue, consumer). */
export function hintTag(queue: string, consumer: string): string {
  return createHash("sha256").update(queue + "\u0000" + consumer).digest("hex").slice(0, 16);
}

/**
 * The payload with which a worker that stopped gracefully wakes the other
 * workers of (queue, consumer): a digest, the Go pool's leaveTag. Gated
 * apart from hintTag, so that the hints every pass sends (a worker's own
 * among them) cannot swallow a leave.
 */
export function leaveTag(queue: string, consumer: string): string {
  return createHash("sha256").update(queue + "\u0000" + consumer + "\u0000left").digest("hex").slice(0, 16);
}

/** Opens the dedicated LISTEN connection (not from the pool: it is held). */
export type ListenConnect = () => Promise<pg.Client>;

/**
 * The LISTEN connection of a pg.Pool: a client of the pool's own Client
 * class with the pool's options. The pool is recognised by its shape, as
 * isPool does, not by instanceof: an application's pg is often another copy
 * of the module than this package's (a file: or linked install, or a pg
 * version npm does not dedupe), and an instanceof test would then turn
 * every wake-up off in silence, leaving each slot to its poll.
 */
export function listenFrom(db: Executor): ListenConnect | null {
  const p = db as { options?: pg.ClientConfig; Client?: typeof pg.Client };
  const opts = p.options;
  if (!isPool(db) || !opts || typeof opts !== "object") return null;
  const Client = typeof p.Client === "function" ? p.Client : pg.Client;
  return async () => {
    const c = new Client(opts);
    await c.connect();
    return c;
  };
}

/** A subscription: fn gets the payload ("" after a reconnect). */
type Sub = { channel: string; match: (payload: string) => boolean; fn: (payload: string) => void };

/**
 * A tick's touched set (pgque._tick_slots): "<tag>:*" for every slot, or
 * "<tag>:<N>=<hex>[,<N>=<hex>...]", N bits in ceil(N/4) hex digits, slot
 * 4j+b being bit 8>>b of digit j. A hint only: anyone may NOTIFY, and a
 * wrong set costs a slot latency until its poll, never an event.
 */
export type Touched = { all: true } | { all: false; sets: Map<number, string> };

/** Decodes payload for the queue tagged tag; null when it is another queue's. Anything unreadable is every slot. */
export function parseTouched(payload: string, tag: string): Touched | null {
  if (!payload.startsWith(tag + ":")) return null;
  const rest = payload.slice(tag.length + 1);
  if (rest === "*") return { all: true };
  const sets = new Map<number, string>();
  for (const part of rest.split(",")) {
    const m = /^([0-9]+)=([0-9a-f]*)$/.exec(part);
    const n = m ? Number(m[1]) : 0;
    if (!m || n < 1 || m[2].length !== Math.ceil(n / 4)) return { all: true };
    sets.set(n, m[2]);
  }
  return { all: false, sets };
}

/** Whether slot of nslots may have work: a slot count the set does not name counts as touched. */
export function touchedHas(t: Touched, nslots: number, slot: number): boolean {
  if (t.all) return true;
  const hex = t.sets.get(nslots);
  if (hex === undefined || slot < 0 || slot >> 2 >= hex.length) return true;
  return (parseInt(hex[slot >> 2], 16) & (8 >> (slot & 3))) !== 0;
}

/** How long to wait before reconnect attempt n (0-based): 100 ms doubling to 10 s, ±20%. */
export function reconnectDelay(n: number): number {
  const base = Math.min(10_000, 100 * 2 ** Math.min(n, 20));
  return base * (0.8 + 0.4 * Math.random());
}

export class Listener {
  private client: pg.Client | null = null;
  private subs = new Set<Sub>();
  private closed = false;
  private timer: NodeJS.Timeout | null = null;
  private attempt = 0;
  private probeTimer: NodeJS.Timeout | null = null;
  private probeToken = "";
  /**
   * The last probe's outcome: "none" (no probe: no notify given, or not
   * connected yet), "waiting", "ok" (the notification arrived), "failed"
   * (it did not within probeWaitMs; onError was told).
   */
  probeState: "none" | "waiting" | "ok" | "failed" = "none";
  /**
   * The backend pid of the connection once its probe came back (it is then
   * a server session of its own, not one a transaction pooler lends), 0
   * otherwise. Slot leases are bound to it (claim_slot's session).
   */
  sessionPid = 0;
  private readonly sessionWatchers = new Set<(pid: number, up: boolean) => void>();
  /** Resolves once the first connection is up or failed. */
  readonly ready: Promise<void>;

  /**
   * channels: what to LISTEN on. With notify (a NOTIFY sent on another
   * connection: the application's pool) each connection also LISTENs on
   * probeChannel and has notify send it a token once; when that
   * notification has not arrived within probeWaitMs, onError gets a
   * ListenNotDeliveringError (see there). The probe goes through another
   * connection because a transaction pooler hands a connection's own
   * NOTIFY back to it (the server sends it before the transaction's end)
   * while it drops the ticker's.
   */
  constructor(
    private readonly connect: ListenConnect,
    private readonly onError: (err: unknown) => void,
    private readonly channels: readonly string[],
    private readonly notify: ((channel: string, payload: string) => Promise<void>) | null = null,
    private readonly probeWaitMs = PROBE_WAIT_MS,
  ) {
    this.ready = this.open();
  }

  /** Calls fn whenever channel carries payload, and after every reconnect (with ""). */
  on(channel: string, payload: string, fn: (payload: string) => void): () => void {
    return this.onMatch(channel, (p) => p === payload, fn);
  }

  /** Calls fn whenever channel carries a payload that starts with prefix, and after every reconnect (with ""). */
  onPrefix(channel: string, prefix: string, fn: (payload: string) => void): () => void {
    return this.onMatch(channel, (p) => p.startsWith(prefix), fn);
  }

  /**
   * Calls fn(pid, true) when sessionPid starts naming a session, and
   * fn(pid, false) when that session ends (it broke, or close()).
   */
  onSession(fn: (pid: number, up: boolean) => void): () => void {
    this.sessionWatchers.add(fn);
    return () => this.sessionWatchers.delete(fn);
  }

  private session(pid: number, up: boolean): void {
    if (up) this.sessionPid = pid;
    else if (pid === 0 || this.sessionPid !== pid) return;
    else this.sessionPid = 0;
    for (const fn of this.sessionWatchers) fn(pid, up);
  }

  private onMatch(channel: string, match: (payload: string) => boolean, fn: (payload: string) => void): () => void {
    const s = { channel, match, fn };
    this.subs.add(s);
    return () => this.subs.delete(s);
  }

  private async open(): Promise<void> {
    if (this.closed) return;
    let c: pg.Client | null = null;
    let pid = 0;
    try {
      c = await this.connect();
      c.on("notification", (n) => {
        const payload = n.payload ?? "";
        if (n.channel === probeChannel) {
          if (payload === this.probeToken && this.probeState === "waiting") {
            this.probed();
            this.probeState = "ok";
            this.session(pid, true);
          }
          return;
        }
        for (const s of this.subs) if (s.channel === n.channel && s.match(payload)) s.fn(payload);
      });
      c.on("error", (err) => this.broken(c!, err));
      c.on("end", () => this.broken(c!, new Error("LISTEN connection ended")));
      if (this.notify) {
        // The server's pid (a pooler reports its own), asked before
        // LISTEN so that the session's last statement says what it is.
        const { rows } = await c.query<{ pid: number }>("select pg_catalog.pg_backend_pid() as pid");
        pid = rows[0]!.pid;
      }
      for (const ch of this.channels) await c.query(`listen ${ch}`);
      if (this.notify) await c.query(`listen ${probeChannel}`);
      if (this.closed) {
        await c.end().catch(() => {});
        return;
      }
      this.client = c;
      const reconnected = this.attempt > 0;
      this.attempt = 0;
      if (reconnected) for (const s of this.subs) s.fn("");
      if (this.notify) this.probe(c);
    } catch (err) {
      if (c) c.end().catch(() => {});
      this.broken(c, err);
    }
  }

  /**
   * Has notify send the probe channel a token for connection c and arms
   * the warning. The token is random: anyone may NOTIFY, but only this
   * probe's disarms it. A probe that cannot be sent (the pool is down)
   * warns of nothing: the pool's own calls report that.
   */
  private probe(c: pg.Client): void {
    this.probed();
    const token = randomBytes(8).toString("hex");
    this.probeToken = token;
    this.probeState = "waiting";
    // The wait starts once the NOTIFY has committed: a slow pool is not a
    // lost notification.
    this.notify!(probeChannel, token).then(
      () => {
        if (this.probeToken !== token || this.probeState !== "waiting") return;
        this.probeTimer = setTimeout(() => {
          this.probeTimer = null;
          if (this.closed || this.client !== c || this.probeToken !== token || this.probeState !== "waiting") return;
          this.probeState = "failed";
          this.onError(new ListenNotDeliveringError(this.probeWaitMs));
        }, this.probeWaitMs);
        this.probeTimer.unref();
      },
      () => {
        if (this.probeToken !== token) return;
        this.probed();
        this.probeState = "none";
      },
    );
  }

  private probed(): void {
    if (this.probeTimer) clearTimeout(this.probeTimer);
    this.probeTimer = null;
  }

  private broken(c: pg.Client | null, err: unknown): void {
    if (this.closed || (c !== null && this.client !== null && this.client !== c)) return;
    if (this.timer) return; // a reconnect is already scheduled
    this.probed();
    if (c) c.removeAllListeners("notification");
    this.client = null;
    this.session(this.sessionPid, false);
    this.onError(err);
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.open();
    }, reconnectDelay(this.attempt++));
    this.timer.unref();
  }

  async close(): Promise<void> {
    this.closed = true;
    this.probed();
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const c = this.client;
    this.client = null;
    this.session(this.sessionPid, false);
    if (c) {
      c.removeAllListeners("notification");
      c.removeAllListeners("end");
      c.on("error", () => {});
      await c.end().catch(() => {});
    }
  }
}
