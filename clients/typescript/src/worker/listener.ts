// LISTEN wake-ups on one dedicated connection.
//
// The ticker NOTIFYs channel `pgque` with a tag of the queue's name after
// each tick, and pools NOTIFY `pgque_workers` with a tag of (queue,
// consumer) after announcing themselves. Payloads are only hints: anyone
// may NOTIFY, so a payload never carries data the pool trusts, it only
// makes a loop look earlier. When the connection breaks, the listener
// reconnects with jittered exponential backoff and, once back, wakes every
// subscriber (notifications sent meanwhile were lost). Polling stays the
// fallback in every loop.

import { createHash } from "node:crypto";
import pg from "pg";

export const tickChannel = "pgque";
export const presenceChannel = "pgque_workers";

/** sha256('tick:' || queue), 16 hex digits: pgque._tick_tag. */
export function tickTag(queue: string): string {
  return createHash("sha256").update("tick:" + queue).digest("hex").slice(0, 16);
}

/** The Go pool's presence hint for (queue, consumer). */
export function hintTag(queue: string, consumer: string): string {
  return createHash("sha256").update(queue + "\u0000" + consumer).digest("hex").slice(0, 16);
}

/** Opens the dedicated LISTEN connection (not from the pool: it is held). */
export type ListenConnect = () => Promise<pg.Client>;

type Sub = { channel: string; payload: string; fn: () => void };

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
  /** Resolves once the first connection is up or failed. */
  readonly ready: Promise<void>;

  constructor(private readonly connect: ListenConnect, private readonly onError: (err: unknown) => void) {
    this.ready = this.open();
  }

  /** Calls fn whenever channel carries payload, and after every reconnect. */
  on(channel: string, payload: string, fn: () => void): () => void {
    const s = { channel, payload, fn };
    this.subs.add(s);
    return () => this.subs.delete(s);
  }

  private async open(): Promise<void> {
    if (this.closed) return;
    let c: pg.Client | null = null;
    try {
      c = await this.connect();
      c.on("notification", (n) => {
        for (const s of this.subs) if (s.channel === n.channel && s.payload === (n.payload ?? "")) s.fn();
      });
      c.on("error", (err) => this.broken(c!, err));
      c.on("end", () => this.broken(c!, new Error("LISTEN connection ended")));
      await c.query(`listen ${tickChannel}`);
      await c.query(`listen ${presenceChannel}`);
      if (this.closed) {
        await c.end().catch(() => {});
        return;
      }
      this.client = c;
      const reconnected = this.attempt > 0;
      this.attempt = 0;
      if (reconnected) for (const s of this.subs) s.fn();
    } catch (err) {
      if (c) c.end().catch(() => {});
      this.broken(c, err);
    }
  }

  private broken(c: pg.Client | null, err: unknown): void {
    if (this.closed || (c !== null && this.client !== null && this.client !== c)) return;
    if (this.timer) return; // a reconnect is already scheduled
    if (c) c.removeAllListeners("notification");
    this.client = null;
    this.onError(err);
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.open();
    }, reconnectDelay(this.attempt++));
    this.timer.unref();
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const c = this.client;
    this.client = null;
    if (c) {
      c.removeAllListeners("notification");
      c.removeAllListeners("end");
      c.on("error", () => {});
      await c.end().catch(() => {});
    }
  }
}
