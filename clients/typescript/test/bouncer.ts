// A throwaway PgBouncer in transaction pooling mode in front of the test
// server, for tests of what a transaction pooler does to the package (as
// the Go tests' internal/pgbouncer). PgBouncer refuses to run as root: it
// runs as the owner of the server's socket directory, who may connect
// through it.

import { spawn, type ChildProcess } from "node:child_process";
import { chmodSync, chownSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import net from "node:net";
import path from "node:path";

export const pgbouncerPath = "/usr/sbin/pgbouncer";

export interface Bouncer {
  /** A postgres:// URL of database dbname through the pooler. */
  url(dbname: string): string;
  /** The pooler's log, for a failure message. */
  log(): string;
  stop(): void;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

/** Starts PgBouncer (pool_mode = transaction, poolSize server connections) in front of the server of dsn. */
export async function startPgBouncer(dsn: string, poolSize = 2): Promise<Bouncer> {
  if (!existsSync(pgbouncerPath)) {
    throw new Error(`pgbouncer is not installed (no ${pgbouncerPath}): install the Debian package pgbouncer; this test must run through a transaction-mode pooler`);
  }
  const u = new URL(dsn);
  const host = u.searchParams.get("host") ?? u.hostname;
  const port = Number(u.searchParams.get("port") ?? (u.port || "5432"));
  const user = decodeURIComponent(u.username || "postgres");
  const socketDir = host.startsWith("/") ? host : null;
  const owner = socketDir ? statSync(socketDir) : null;
  const dir = mkdtempSync("/tmp/pgque-ts-bouncer-");
  chmodSync(dir, 0o755);
  const asRoot = process.getuid?.() === 0;
  if (asRoot && owner) chownSync(dir, owner.uid, owner.gid);
  const listenPort = await freePort();
  const logFile = path.join(dir, "pgbouncer.log");
  writeFileSync(
    path.join(dir, "pgbouncer.ini"),
    [
      "[databases]",
      `* = host=${host} port=${port} user=${user}`,
      "[pgbouncer]",
      "listen_addr = 127.0.0.1",
      "unix_socket_dir =",
      `listen_port = ${listenPort}`,
      "auth_type = any",
      "pool_mode = transaction",
      "max_client_conn = 200",
      `default_pool_size = ${poolSize}`,
      "server_reset_query =",
      "ignore_startup_parameters = extra_float_digits,search_path",
      `logfile = ${logFile}`,
      "",
    ].join("\n"),
  );
  const child: ChildProcess = spawn(pgbouncerPath, [path.join(dir, "pgbouncer.ini")], {
    cwd: dir,
    stdio: "ignore",
    uid: asRoot && owner ? owner.uid : undefined,
    gid: asRoot && owner ? owner.gid : undefined,
  });
  let exited = false;
  child.on("exit", () => (exited = true));
  child.on("error", () => (exited = true));
  const log = () => (existsSync(logFile) ? readFileSync(logFile, "utf8") : "");
  const stop = () => {
    if (!exited) child.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 10_000;
  for (;;) {
    const up = await new Promise<boolean>((resolve) => {
      const s = net.connect(listenPort, "127.0.0.1", () => {
        s.end();
        resolve(true);
      });
      s.on("error", () => resolve(false));
    });
    if (up) break;
    if (exited || Date.now() > deadline) {
      const l = log();
      stop();
      throw new Error(`pgbouncer did not start: ${l}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url: (dbname) => `postgres://${encodeURIComponent(user)}@127.0.0.1:${listenPort}/${encodeURIComponent(dbname)}`,
    log,
    stop,
  };
}
