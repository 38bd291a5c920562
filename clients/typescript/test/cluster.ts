// A throwaway PostgreSQL cluster for the tests, started from the server
// binaries on this machine (as the Go tests' internal/pgcluster does).
//
// PostgreSQL refuses to run as root, so a root caller (CI) runs initdb,
// pg_ctl and the server as an unprivileged OS user: "pgque", created as a
// system user when missing, else "nobody". The server listens only on a Unix
// socket in the cluster's own directory, with trust authentication.

import { execFileSync, spawn, spawnSync, type ChildProcess } from "node:child_process";
import { chmodSync, chownSync, existsSync, mkdtempSync, readFileSync, appendFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import net from "node:net";
import { fileURLToPath } from "node:url";

export interface Cluster {
  /** Directory of the socket, the data directory and the server log. */
  dir: string;
  port: number;
  /** A postgres:// URL for database dbname as the superuser. */
  url(dbname: string): string;
  /** Stops the server and removes the directory; safe to call twice. */
  stop(): void;
}

interface OsUser {
  uid?: number;
  gid?: number;
}

/**
 * Finds the directory holding initdb and pg_ctl, as the Go tests do:
 * PGQUE_PG_BINDIR names it; PGQUE_PG_VERSION names a major, looked up in
 * the build cache scripts/fetch-postgres fills (PGQUE_PG_CACHE, else
 * .cache/postgres in the nearest directory above this one that has it),
 * then in Debian's layout; otherwise Debian's newest of 17, 16 and 15, or
 * pg_ctl on PATH.
 */
function binDir(): string {
  const fromEnv = process.env.PGQUE_PG_BINDIR;
  if (fromEnv) return fromEnv;
  const major = process.env.PGQUE_PG_VERSION;
  if (major) return versionBinDir(major);
  for (const v of ["17", "16", "15"]) {
    const d = `/usr/lib/postgresql/${v}/bin`;
    if (existsSync(path.join(d, "pg_ctl"))) return d;
  }
  const which = spawnSync("sh", ["-c", "command -v pg_ctl"], { encoding: "utf8" });
  if (which.status === 0 && which.stdout.trim() !== "") return path.dirname(which.stdout.trim());
  throw new Error("no PostgreSQL server binaries found (install PostgreSQL 15+, `make deps`, or set PGQUE_TEST_DSN)");
}

function versionBinDir(major: string): string {
  if (!/^[1-9][0-9]$/.test(major)) throw new Error(`PGQUE_PG_VERSION=${JSON.stringify(major)} is not a PostgreSQL major version such as 18`);
  const candidates: string[] = [];
  const cache = process.env.PGQUE_PG_CACHE ?? buildCache();
  if (cache) candidates.push(path.join(cache, major, "bin"));
  candidates.push(`/usr/lib/postgresql/${major}/bin`);
  const found = candidates.find((d) => existsSync(path.join(d, "pg_ctl")));
  if (found) return found;
  throw new Error(`PGQUE_PG_VERSION=${major}: no server binaries in ${candidates.join(", ")}; fetch them with \`scripts/fetch-postgres ${major}\``);
}

/** .cache/postgres in the nearest directory above this file's that has one. */
function buildCache(): string | undefined {
  for (let dir = path.dirname(fileURLToPath(import.meta.url)); ; dir = path.dirname(dir)) {
    const cache = path.join(dir, ".cache", "postgres");
    if (existsSync(cache)) return cache;
    if (dir === path.dirname(dir)) return undefined;
  }
}

function lookupUser(name: string): OsUser | undefined {
  const r = spawnSync("id", ["-u", name], { encoding: "utf8" });
  if (r.status !== 0) return undefined;
  const g = spawnSync("id", ["-g", name], { encoding: "utf8" });
  return { uid: Number(r.stdout.trim()), gid: Number(g.stdout.trim()) };
}

/** Who runs the server: the caller, or an unprivileged user for root. */
function serverUser(): OsUser {
  if (process.getuid?.() !== 0) return {};
  let u = lookupUser("pgque");
  if (u === undefined) {
    // Another process may create it at the same time: look again after.
    spawnSync("useradd", ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "pgque"]);
    u = lookupUser("pgque") ?? lookupUser("nobody");
  }
  if (u === undefined) throw new Error("no unprivileged OS user to run postgres as (tried pgque and nobody)");
  return u;
}

function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once("error", () => resolve(5432));
    srv.listen(0, "127.0.0.1", () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

// The watchdog tears the cluster down once the process that started it is
// gone without stopping it (a test file killed by a timeout or a signal,
// where no exit handler runs): SIGQUIT to the postmaster is an immediate
// shutdown, then the directory is removed. $1 is the pid to watch, $2 the
// cluster directory. The Go tests' clusters (internal/pgcluster) do the same.
const watchdogScript = `
while kill -0 "$1" 2>/dev/null; do sleep 1; done
pid=$(head -n 1 "$2/data/postmaster.pid" 2>/dev/null) && kill -QUIT "$pid" 2>/dev/null
for _ in 1 2 3 4 5 6 7 8 9 10; do
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
rm -rf "$2"
`;

/** Starts the watchdog in a session of its own, so a ^C to the caller's group spares it. */
function startWatchdog(dir: string): ChildProcess | undefined {
  try {
    const wd = spawn("/bin/sh", ["-c", watchdogScript, "pgque-cluster-watchdog", String(process.pid), dir], {
      detached: true,
      stdio: "ignore",
    });
    wd.on("error", () => {});
    wd.unref();
    return wd;
  } catch {
    return undefined; // the cluster works without that safety net
  }
}

/** Starts a new cluster; it is stopped when the process exits, or by a watchdog when it is killed. */
export async function startCluster(): Promise<Cluster> {
  const bin = binDir();
  const user = serverUser();
  // Socket paths are limited to about 100 bytes: keep the directory short.
  const base = tmpdir().length > 60 || user.uid !== undefined ? "/tmp" : tmpdir();
  // Connections are trusted: only the server's OS user (and root) may
  // reach the socket, so another local account cannot connect as the
  // superuser.
  const dir = mkdtempSync(path.join(base, "pgque-ts-"));
  chmodSync(dir, 0o700);
  if (user.uid !== undefined) chownSync(dir, user.uid, user.gid!);
  const port = await freePort();
  const data = path.join(dir, "data");
  const log = path.join(dir, "postgres.log");
  const env: NodeJS.ProcessEnv = { HOME: dir, PATH: process.env.PATH };
  const run = (cmd: string, args: string[]) =>
    execFileSync(path.join(bin, cmd), args, { env, uid: user.uid, gid: user.gid, stdio: "pipe", cwd: dir });

  const watchdog = startWatchdog(dir);
  let stopped = false;
  const stop = () => {
    if (stopped) return;
    stopped = true;
    watchdog?.kill();
    try {
      run("pg_ctl", ["stop", "-D", data, "-m", "immediate", "-w"]);
    } catch {
      // Not running (a failed start): nothing to stop.
    }
    rmSync(dir, { recursive: true, force: true });
  };
  process.once("exit", stop);
  try {
    run("initdb", ["-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"]);
    appendFileSync(
      path.join(data, "postgresql.conf"),
      [
        "",
        "# throwaway test cluster, not durable",
        "listen_addresses = ''",
        `unix_socket_directories = '${dir}'`,
        "unix_socket_permissions = 0700",
        `port = ${port}`,
        "fsync = off",
        "max_connections = 300",
        "shared_buffers = '128MB'",
        "",
      ].join("\n"),
    );
    run("pg_ctl", ["start", "-D", data, "-l", log, "-w", "-t", "60"]);
  } catch (err) {
    const tail = existsSync(log) ? readFileSync(log, "utf8").split("\n").slice(-30).join("\n") : "";
    stop();
    throw new Error(`starting a throwaway postgres: ${(err as Error).message}\n${tail}`);
  }
  return {
    dir,
    port,
    url: (dbname) =>
      `postgres://postgres@localhost/${encodeURIComponent(dbname)}?host=${encodeURIComponent(dir)}&port=${port}`,
    stop,
  };
}
