// The ticker, in process.
//
// Consumers see nothing until a tick covers their events, so some process
// must tick. A Ticker does what the Go library's Ticker (internal/tickerd)
// does, through the same SQL: it keeps the single ticker lease
// (pgque.ticker_lead), and while it leads calls pgque.ticker() every
// tickIntervalMs, pgque.maint_retry_events() every retryIntervalMs, and
// pgque.maint() and pgque.maint_route_indexes() every maintIntervalMs (and
// maint_route_indexes() when a subscribe asks, at most once a second). Any
// number of tickers, Go or TypeScript, may run against one database: they
// elect one leader through that lease, and only the leader works. stop()
// resigns the lease (pgque.ticker_resign notifies channel pgque_ticker), so
// a standing ticker that LISTENs there takes over at once instead of at its
// next lease check.
//
// Every call is its own short statement on the pool, so the ticker works
// through a transaction-mode pooler too (with listen: false: the resign
// wake-up needs LISTEN, and the lease is then sought every quarter of its
// TTL). The LISTEN connection is its own, as the worker pool's is, never
// one of the pool's: held for the ticker's life, it would leave a pool of
// max 1 with nothing to tick with, and a small one a connection short.
//
// The functions it calls are pgque_admin's: start() checks the role's
// rights first and fails at once, naming each function it may not run,
// rather than warning for ever.

import { intervalParam, type Executor } from "./executor.js";
import { PgqueError, mapError } from "./errors.js";
import { checkSchema } from "./migrate.js";
import { WORKER_ID_MAX_BYTES, defaultWorkerId } from "./workerid.js";
import { Listener, listenFrom, type ListenConnect } from "./worker/listener.js";

export const TICK_INTERVAL_MS_DEFAULT = 10;
export const RETRY_INTERVAL_MS_DEFAULT = 1_000;
export const MAINT_INTERVAL_MS_DEFAULT = 30_000;
export const TICKER_LEASE_TTL_MS_DEFAULT = 10_000;
/** The shortest lease TTL accepted: leases are renewed at a quarter of it. */
export const LEASE_TTL_MS_MIN = 1_000;
/** The longest lease the server grants. */
export const LEASE_TTL_MS_MAX = 24 * 3600 * 1000;

/** The channel ticker_resign notifies. */
const RESIGN_CHANNEL = "pgque_ticker";
/**
 * The payload on RESIGN_CHANNEL with which a committed subscribe,
 * unsubscribe or resize asks the leader for maint_route_indexes(): the SQL
 * leaves index changes to it, since their locks would last as long as the
 * caller's transaction.
 */
const INDEXES_PAYLOAD = "indexes";
/** The least time between two maint_route_indexes() calls so asked for. */
const INDEXES_EVERY_MS = 1_000;

/** The functions a ticker runs: the role needs EXECUTE on each. */
export const TICKER_FUNCTIONS = [
  "ticker_lead(text, interval)",
  "ticker_resign(text)",
  "ticker()",
  "maint_retry_events()",
  "maint()",
  "maint_route_indexes()",
] as const;

export interface TickerOptions {
  /** Identifies this ticker in the lease; default host-pid-random. */
  workerId?: string;
  /** The lease lifetime; default 10 s, 1 s to 1 day. */
  leaseTtlMs?: number;
  /** How often the leader calls ticker(); default 10 ms. */
  tickIntervalMs?: number;
  /** How often the leader re-inserts due retries; default 1 s. */
  retryIntervalMs?: number;
  /** How often the leader runs maintenance; default 30 s. */
  maintIntervalMs?: number;
  /** Receives each error of the loop (it goes on after a backoff); default console.warn. */
  onError?: (err: unknown) => void;
  /** Called when this ticker gains or loses the lease. */
  onLeaderChange?: (leader: boolean) => void;
  /**
   * Opens the connection that LISTENs for a leader's resignation, so that
   * a standing ticker takes over at once. Default: a pg.Client of its own
   * with the pool's options when exec is a pg.Pool (not one of the pool's
   * connections); `false`: none (behind a transaction pooler, where LISTEN
   * does not work), and the lease is sought every quarter of its TTL.
   */
  listen?: ListenConnect | false;
}

/** Counters for tests and status pages. */
export interface TickerStats {
  /** ticker_lead calls answered. */
  leadChecks: number;
  /** ticker() calls made while leading. */
  ticks: number;
  /** Errors the loop met. */
  errors: number;
}

/** A ticker running in this process. */
export class Ticker {
  readonly workerId: string;
  readonly stats: TickerStats = { leadChecks: 0, ticks: 0, errors: 0 };
  private readonly leaseTtlMs: number;
  private readonly tickIntervalMs: number;
  private readonly retryIntervalMs: number;
  private readonly maintIntervalMs: number;
  private readonly onError: (err: unknown) => void;
  private readonly onLeaderChange: (leader: boolean) => void;

  private leader = false;
  private started = false;
  private stopping = false;
  private loop?: Promise<void>;
  private wake?: () => void;
  private readonly listenConnect: ListenConnect | null;
  private listener?: Listener;
  // When each duty is due next, and the local, conservative end of the lease.
  private nextLead = 0;
  private nextRetry = 0;
  private nextMaint = 0;
  private leaderUntil = 0;
  // Set by an INDEXES_PAYLOAD, cleared by the next maint_route_indexes().
  private indexesDue = false;
  private nextIndexes = 0;

  constructor(private readonly exec: Executor, opts: TickerOptions = {}) {
    this.workerId = opts.workerId ?? defaultWorkerId();
    this.leaseTtlMs = opts.leaseTtlMs ?? TICKER_LEASE_TTL_MS_DEFAULT;
    this.tickIntervalMs = opts.tickIntervalMs ?? TICK_INTERVAL_MS_DEFAULT;
    this.retryIntervalMs = opts.retryIntervalMs ?? RETRY_INTERVAL_MS_DEFAULT;
    this.maintIntervalMs = opts.maintIntervalMs ?? MAINT_INTERVAL_MS_DEFAULT;
    this.onError = opts.onError ?? ((err) => console.warn("pgque: ticker:", err instanceof Error ? err.message : err));
    this.onLeaderChange = opts.onLeaderChange ?? (() => {});
    this.listenConnect = opts.listen === false ? null : opts.listen ?? listenFrom(exec);
    const id = Buffer.byteLength(this.workerId);
    if (id === 0 || id > WORKER_ID_MAX_BYTES) {
      throw new PgqueError(`pgque: ticker workerId must be 1 to ${WORKER_ID_MAX_BYTES} bytes, got ${id}`, "invalid_argument");
    }
    if (!(this.leaseTtlMs >= LEASE_TTL_MS_MIN && this.leaseTtlMs <= LEASE_TTL_MS_MAX)) {
      throw new PgqueError(`pgque: ticker leaseTtlMs ${this.leaseTtlMs} is outside ${LEASE_TTL_MS_MIN} to ${LEASE_TTL_MS_MAX}`, "invalid_argument");
    }
    for (const [name, v] of [["tickIntervalMs", this.tickIntervalMs], ["retryIntervalMs", this.retryIntervalMs], ["maintIntervalMs", this.maintIntervalMs]] as const) {
      if (!(v >= 0 && Number.isFinite(v))) {
        throw new PgqueError(`pgque: ticker ${name} must be a non-negative number, got ${v}`, "invalid_argument");
      }
    }
  }

  /** Whether this ticker holds the lease right now (as far as it knows). */
  isLeader(): boolean {
    return this.leader;
  }

  /**
   * Checks the schema version and the role's rights, then starts the loop
   * in the background. Fails with kind "permission_denied" naming every
   * function the role may not execute, "not_installed" or "schema_version",
   * and with "already_started" when called a second time: a Ticker starts
   * once, and one that was stopped stays stopped (create a new Ticker).
   */
  async start(): Promise<void> {
    if (this.stopping) {
      // A second run would share this one's lease state, listener and
      // wake-up with a loop that may still be ending: a new Ticker has none.
      throw new PgqueError("pgque: this ticker was stopped and does not start again; create a new Ticker", "already_started");
    }
    if (this.started) throw new PgqueError("pgque: ticker already started", "already_started");
    this.started = true;
    try {
      await checkSchema(this.exec);
      await checkTickerRights(this.exec);
    } catch (err) {
      this.started = false;
      throw err;
    }
    await this.listen();
    this.loop = this.run();
  }

  /**
   * Stops ticking, resigns the lease so that another ticker takes over at
   * once, and resolves when the loop has ended. Idempotent; a ticker never
   * started is left as it is (it may start later).
   */
  async stop(): Promise<void> {
    // Before start() there is nothing to stop, and a stopping flag set
    // then made a later start() run a loop that ended at once, silently.
    if (!this.started) return;
    this.stopping = true;
    this.wake?.();
    await this.loop;
  }

  private async run(): Promise<void> {
    let failures = 0;
    try {
      while (!this.stopping) {
        const start = Date.now();
        let wait: number;
        try {
          await this.step(start);
          failures = 0;
          // Polls start tickIntervalMs apart however long the step took.
          wait = this.leader ? Math.max(0, this.tickIntervalMs - (Date.now() - start)) : this.nextLead - Date.now();
        } catch (err) {
          if (this.stopping) break;
          this.stats.errors++;
          this.onError(mapError("ticking", err));
          wait = errorBackoff(failures++);
        }
        await this.sleep(wait);
      }
    } finally {
      await this.resign();
      await this.listener?.close();
      this.listener = undefined;
    }
  }

  /** Renews or seeks the lease when due, then does the leader's duties. */
  private async step(now: number): Promise<void> {
    if (now >= this.nextLead) {
      let ok: boolean;
      try {
        const { rows } = await bounded("ticker_lead", this.leaseTtlMs, this.exec.query<{ ok: boolean }>(
          "select coalesce(pgque.ticker_lead($1::pg_catalog.text, $2::interval), false) as ok",
          [this.workerId, intervalParam(this.leaseTtlMs)],
        ));
        ok = rows[0]!.ok;
        this.stats.leadChecks++;
      } catch (err) {
        this.setLeader(now < this.leaderUntil);
        throw err;
      }
      // ticker_lead renews only when less than half the TTL is left, so
      // true guarantees half a TTL from the call's start; asking again
      // every quarter keeps the local view continuous.
      this.nextLead = now + jitter(this.leaseTtlMs / 4, 0.1);
      this.leaderUntil = ok ? now + this.leaseTtlMs / 2 - this.leaseTtlMs / 10 : 0;
    }
    if (!this.setLeader(now < this.leaderUntil)) return;
    // Its own transaction, committed without waiting for the WAL flush:
    // a tick is a snapshot that every later record referring to it
    // follows in the WAL (docs/design.md, "Ticks commit without a flush").
    await bounded("ticker()", this.leaseTtlMs, this.exec.query(
      "select pgque.ticker() from pg_catalog.set_config('synchronous_commit', 'off', true)"));
    this.stats.ticks++;
    if (now >= this.nextRetry) {
      this.nextRetry = now + this.retryIntervalMs;
      await bounded("maint_retry_events()", this.leaseTtlMs, this.exec.query("select pgque.maint_retry_events()"));
    }
    if (now >= this.nextMaint) {
      this.nextMaint = now + this.maintIntervalMs;
      await bounded("maint()", MAINT_TIMEOUT_MS, this.exec.query("select pgque.maint()"));
      // Routing indexes left out while their tables were full are built
      // once rotation emptied them.
      await this.routeIndexes(now);
    } else if (this.indexesDue && now >= this.nextIndexes) {
      await this.routeIndexes(now);
    }
  }

  private async routeIndexes(now: number): Promise<void> {
    this.indexesDue = false;
    this.nextIndexes = now + INDEXES_EVERY_MS;
    await bounded("maint_route_indexes()", MAINT_TIMEOUT_MS, this.exec.query("select pgque.maint_route_indexes()"));
  }

  private setLeader(leader: boolean): boolean {
    if (this.leader !== leader) {
      this.leader = leader;
      this.onLeaderChange(leader);
    }
    return leader;
  }

  private async resign(): Promise<void> {
    if (!this.leader) return;
    this.setLeader(false);
    try {
      await bounded("ticker_resign", this.leaseTtlMs,
        this.exec.query("select pgque.ticker_resign($1::pg_catalog.text)", [this.workerId]));
    } catch (err) {
      this.onError(mapError("resigning the ticker lease", err));
    }
  }

  /** Waits ms, or until stop() or a leader's resignation wakes the loop. */
  private sleep(ms: number): Promise<void> {
    if (this.stopping) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(done, Math.max(0, ms));
      function done() {
        clearTimeout(timer);
        resolve();
      }
      this.wake = done;
    });
  }

  /**
   * LISTENs for resignations on a connection of its own (listen), which
   * reconnects when it breaks. Without one (a single connection given, or
   * listen: false) the lease is still sought every quarter TTL.
   */
  private async listen(): Promise<void> {
    if (this.listenConnect === null) return;
    const l = new Listener(this.listenConnect, (err) => this.onError(mapError("listening for ticker resignations", err)), [RESIGN_CHANNEL]);
    // Also called with "" after a reconnect: a resignation or a request
    // for indexes may have been missed meanwhile, and seeking the lease
    // once more costs one call. A request for indexes does not wake the
    // loop: a role that sends it in a loop (NOTIFY needs no privilege)
    // would make the leader tick as often.
    l.onPrefix(RESIGN_CHANNEL, "", (payload) => {
      if (payload === INDEXES_PAYLOAD || payload === "") this.indexesDue = true;
      if (payload === INDEXES_PAYLOAD || this.leader) return;
      this.nextLead = 0;
      this.wake?.();
    });
    this.listener = l;
    await l.ready;
  }
}

/**
 * Fails with a PgqueError of kind "permission_denied" naming each ticker
 * function the current role may not execute (with the grant that fixes
 * it), or "not_installed" when a function is missing.
 */
export async function checkTickerRights(exec: Executor): Promise<void> {
  let rows: { sig: string; ok: boolean | null }[];
  let role: string;
  try {
    const r = await exec.query<{ sig: string; ok: boolean | null }>(
      `select f.sig,
              (select pg_catalog.has_schema_privilege(n.oid, 'USAGE')
                      and pg_catalog.has_function_privilege(p.oid, 'EXECUTE')
                 from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid = p.pronamespace
                where n.nspname operator(pg_catalog.=) 'pgque'
                  and p.proname || '(' || pg_catalog.oidvectortypes(p.proargtypes) || ')' operator(pg_catalog.=) f.sig) as ok
         from pg_catalog.unnest($1::pg_catalog.text[]) as f(sig)`,
      [TICKER_FUNCTIONS],
    );
    rows = r.rows;
    role = (await exec.query<{ u: string }>("select current_user as u")).rows[0]!.u;
  } catch (err) {
    throw mapError("checking the ticker's rights", err);
  }
  const missing = rows.filter((r) => r.ok === null).map((r) => `pgque.${r.sig}`);
  if (missing.length > 0) {
    throw new PgqueError(`pgque: the ticker's functions are missing (${missing.join(", ")}): run migrate()`, "not_installed");
  }
  const denied = rows.filter((r) => !r.ok).map((r) => `pgque.${r.sig}`);
  if (denied.length > 0) {
    throw new PgqueError(
      `pgque: role "${role}" may not run the ticker: it lacks EXECUTE on ${denied.join(", ")}; ` +
        `run the ticker as a role in pgque_admin (grant pgque_admin to "${role}")`,
      "permission_denied",
      "42501",
    );
  }
}

/** How long one maint() or maint_route_indexes() call may take. */
const MAINT_TIMEOUT_MS = 5 * 60_000;

/**
 * Rejects when p has not settled within ms, so that a hung statement (a
 * lock that never comes) cannot stall the loop for ever: the lease calls
 * and ticks are bounded by the lease TTL (past it the leadership is lost
 * anyway), maintenance by MAINT_TIMEOUT_MS. The statement itself runs on
 * until the server ends it; on a pool the loop goes on with other
 * connections.
 */
function bounded<T>(what: string, ms: number, p: Promise<T>): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`pgque: ${what} did not return within ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

/** d spread by ±frac at random, so that tickers do not march in step. */
function jitter(d: number, frac: number): number {
  return d * (1 - frac + 2 * frac * Math.random());
}

/** Exponential backoff after consecutive errors: 100 ms doubling to 5 s, jittered. */
function errorBackoff(failures: number): number {
  return jitter(Math.min(5_000, 100 * 2 ** Math.min(failures, 10)), 0.2);
}
