// A TypeScript worker process of `pgque chaos` (cmd/pgque/internal/chaos):
// the runner starts it with `node dist/test/chaos_worker.js` beside its Go
// worker processes, on the same partitioned consumer, under the same
// faults. It does what the Go chaos worker (proc.go, runWorker) does:
//
//   - reads its ProcConfig from PGQUE_CHAOS_PROC (durations in
//     nanoseconds, as Go encodes them);
//   - runs work() (or workTx() with -tx, writing one chaos_effects row per
//     handler transaction) with the run's lease TTL, batch size and
//     failure policy, its lease worker id being the process id;
//   - records every handler run in its JSON-lines file the way record.go
//     does: a start record, written and fsynced before the body runs, and
//     an end record with the outcome, one write(2) each, so that a SIGKILL
//     loses no record the checker needs;
//   - injects handler errors, crashes (a thrown non-Error, the nearest
//     thing to a Go panic), slow runs past the lease TTL, and fails poison
//     events always;
//   - logs the slots it fenced and the slot calls that failed in the Go
//     logger's text format, which the runner reads to explain a chunk
//     delivered again under the same epoch, and the slots it claimed (the
//     start of an epoch, for the checker);
//   - stops gracefully on SIGTERM (at most 10 s, then hard).
//
// Under pause the pool itself never hands a key's later events of a chunk
// to the handler after one failed (the lane stops), so this worker needs
// no guard of its own for them and records no "skipped" runs.

import { closeSync, fsyncSync, openSync, writeSync } from "node:fs";
import pg from "pg";
import { work, workTx, LeaseLostError, type Message, type WorkOptions, type Worker } from "../src/index.js";

interface ProcConfig {
  id: string;
  dsn: string;
  poll_only: boolean;
  gather: boolean;
  record: string;
  queue: string;
  consumer: string;
  slots: number;
  policy: "pause" | "skip";
  lease_ttl: number;
  retry_delay: number;
  batch_size: number;
  lanes: number;
  error_rate: number;
  panic_rate: number;
  slow_rate: number;
  sleep_max: number;
  tx: boolean;
}

interface Payload {
  key: string;
  seq: number;
  poison?: boolean;
}

const ns = 1e6; // nanoseconds per millisecond

// Wall-clock time with sub-millisecond resolution: the checker orders the
// runs of a key by their recorded times, and Date.now()'s milliseconds
// would make a run's end and the next one's start equal.
const originNs = BigInt(Date.now()) * 1_000_000n - process.hrtime.bigint();
function now(): string {
  const t = originNs + process.hrtime.bigint();
  const iso = new Date(Number(t / 1_000_000n)).toISOString(); // ...ss.mmmZ
  return `${iso.slice(0, 19)}.${(t % 1_000_000_000n).toString().padStart(9, "0")}Z`;
}

/** The record file: one write per record, starts fsynced (record.go). */
class Recorder {
  private n = 0;
  constructor(private readonly fd: number, private readonly proc: string) {}

  start(m: Message<Payload>): number {
    const n = ++this.n;
    // ev_id and epoch are written as the exact digits the server sent.
    const line = `{"t":"s","n":${n},"proc":${JSON.stringify(this.proc)},"slot":${m.slot},"nslots":${m.nslots},` +
      `"epoch":${m.epoch.toString()},"key":${JSON.stringify(m.key ?? "")},"ev_id":${m.id},"seq":${Number(m.payload?.seq ?? 0)},` +
      `"retry":${m.retryCount},"outcome":"","start":"${now()}"}\n`;
    writeSync(this.fd, line);
    fsyncSync(this.fd);
    return n;
  }

  end(n: number, outcome: string): void {
    writeSync(this.fd, `{"t":"e","n":${n},"proc":${JSON.stringify(this.proc)},"outcome":"${outcome}","end":"${now()}"}\n`);
  }
}

/** A log line the runner's logFaults reads (Go slog text format). */
function logLine(msg: string, worker: string, slot: number | null, err: unknown): void {
  const s = slot === null ? "" : ` slot=${slot}`;
  process.stderr.write(`time=${now()} level=WARN msg=${JSON.stringify(msg)} worker=${worker}${s} error=${JSON.stringify(String(err))}\n`);
}

function slotOf(err: unknown): number | null {
  if (err instanceof LeaseLostError) return err.slot;
  const m = /\bslot (\d+)\b/.exec(err instanceof Error ? err.message : String(err));
  return m ? Number(m[1]) : null;
}

/**
 * The pg options of a DSN: a postgres:// URL, or the keyword=value form
 * the runner's cluster and PgBouncer give (keywords pg does not know, such
 * as pgx's default_query_exec_mode, are left out: pg's parameterized
 * queries use the unnamed statement, which a transaction pooler accepts).
 */
function pgConfig(dsn: string): pg.PoolConfig {
  if (/^postgres(ql)?:\/\//.test(dsn)) return { connectionString: dsn };
  const kv = new Map<string, string>();
  for (const m of dsn.matchAll(/(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)/g)) {
    const v = m[2]!;
    kv.set(m[1]!, v.startsWith("'") ? v.slice(1, -1).replace(/\\(.)/g, "$1") : v);
  }
  const cfg: pg.PoolConfig = {};
  if (kv.has("host")) cfg.host = kv.get("host");
  if (kv.has("port")) cfg.port = Number(kv.get("port"));
  if (kv.has("user")) cfg.user = kv.get("user");
  if (kv.has("password")) cfg.password = kv.get("password");
  if (kv.has("dbname")) cfg.database = kv.get("dbname");
  if (kv.has("connect_timeout")) cfg.connectionTimeoutMillis = 1000 * Number(kv.get("connect_timeout"));
  return cfg;
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

async function main(): Promise<number> {
  const cfg = JSON.parse(process.env.PGQUE_CHAOS_PROC ?? "") as ProcConfig;
  const fd = openSync(cfg.record, "a");
  const rec = new Recorder(fd, cfg.id);
  const leaseTtlMs = cfg.lease_ttl / ns;

  const body = async (m: Message<Payload>, signal: AbortSignal): Promise<void> => {
    const n = rec.start(m);
    let sleepMs = Math.random() * (cfg.sleep_max / ns);
    if (Math.random() < cfg.slow_rate) sleepMs = leaseTtlMs * 1.2; // outlives the TTL: the keeper must renew
    const dice = Math.random();
    try {
      await sleep(sleepMs, signal);
    } catch (reason) {
      rec.end(n, "cancelled");
      throw reason;
    }
    if (m.payload?.poison || dice < cfg.error_rate) {
      rec.end(n, "error");
      throw new Error("chaos: injected handler error");
    }
    if (dice < cfg.error_rate + cfg.panic_rate) {
      rec.end(n, "panic");
      throw "chaos: injected handler crash"; // eslint-disable-line no-throw-literal
    }
    rec.end(n, "ok");
  };

  const pool = new pg.Pool({ ...pgConfig(cfg.dsn), max: Math.max(10, cfg.slots + 4) });
  pool.on("error", () => {}); // an idle connection lost to a restart: the next checkout reconnects
  const opts: WorkOptions = {
    queue: cfg.queue,
    consumer: cfg.consumer,
    slots: cfg.slots,
    failurePolicy: cfg.policy,
    workerId: cfg.id,
    leaseTtlMs,
    claimIntervalMs: 200,
    pollIntervalMs: 100,
    batchSize: cfg.batch_size,
    // The Go workers run `lanes` handlers per slot at once.
    concurrency: Math.max(1, cfg.lanes) * cfg.slots,
    retryDelayMs: (retry) => (cfg.retry_delay / ns) * (retry + 1),
    listen: cfg.poll_only ? false : undefined,
    gatherReceives: cfg.gather === true,
    // The checker takes a claim as the start of its epoch, as the Go
    // workers' debug log "pgque: slot claimed" says.
    onSlot: (c) => {
      if (c.kind === "claimed") {
        process.stderr.write(`time=${now()} level=DEBUG msg="pgque: slot claimed" worker=${cfg.id} slot=${c.slot} nslots=${c.nslots} epoch=${c.epoch}\n`);
      }
    },
    onError: (err) => {
      if (err instanceof LeaseLostError) logLine("pgque: slot fenced", cfg.id, err.slot, err);
      else {
        const slot = slotOf(err);
        logLine(slot === null ? "pgque: worker error" : "pgque: working slot", cfg.id, slot, err);
      }
    },
  };

  let w: Worker | null = null;
  let stopping = false;
  const stopped = new Promise<void>((resolve) => {
    const stop = () => {
      stopping = true;
      resolve();
    };
    process.once("SIGTERM", stop);
    process.once("SIGINT", stop);
  });
  // The database may be restarting: retry until work() has subscribed.
  while (w === null && !stopping) {
    try {
      w = cfg.tx
        ? await workTx<Payload>(pool, opts, async (m, tx, ctx) => {
          await tx.query("insert into chaos_effects values ($1, $2, $3)", [m.id, cfg.id, m.epoch.toString()]);
          await body(m, ctx.signal);
        })
        : await work<Payload>(pool, opts, (m, ctx) => body(m, ctx.signal));
    } catch (err) {
      logLine("chaos worker: start failed, retrying", cfg.id, null, err);
      await new Promise((r) => setTimeout(r, 200));
    }
  }
  await stopped;
  await w?.stop({ timeoutMs: 10_000 });
  await pool.end().catch(() => {});
  closeSync(fd);
  return 0;
}

process.exitCode = await main();
