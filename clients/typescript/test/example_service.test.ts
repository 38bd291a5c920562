// The newcomer's flow with the package and no Go toolchain: the package is
// packed as npm would publish it, installed from the tarball into a copy of
// examples/typescript-service, built, and run against PostgreSQL with the
// logins a deployment has (database owner for migrate, an application
// login with pgque_writer and pgque_reader, a ticker login with
// pgque_admin), with every Go directory removed from PATH and Go's
// variables unset.
//
// Asserted: the events of committed requests are each applied once, in
// order per tenant, across a graceful stop in the middle of the stream and
// a restart (which migrates again); a request whose transaction rolls back
// after its sendBatch delivers nothing; SIGTERM lets the service finish,
// release its slots and exit 0 on its own.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn, spawnSync, type ChildProcess } from "node:child_process";
import { cpSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { createInterface } from "node:readline";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { slots } from "../src/index.js";
import { testDb, waitFor, type TestDb } from "./harness.js";

const pkgDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const repo = path.resolve(pkgDir, "../..");

/** The environment of a machine without Go: no Go directory on PATH, no Go variables. */
function withoutGo(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const k of Object.keys(env)) if (/^GO[A-Z0-9_]*$/.test(k) || k === "CGO_ENABLED") delete env[k];
  const dirs = (env.PATH ?? "").split(path.delimiter).filter((d) =>
    d !== "" && !/(^|\/)go(\/|$)/.test(d) && !existsSync(path.join(d, "go")) && !existsSync(path.join(d, "pgque")));
  // node and npm themselves stay reachable.
  env.PATH = [path.dirname(process.execPath), ...dirs].join(path.delimiter);
  delete env.PGQUE_TEST_DSN;
  return env;
}

function run(cmd: string, args: string[], cwd: string, env: NodeJS.ProcessEnv): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { cwd, env, maxBuffer: 1 << 24 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${cmd} ${args.join(" ")} in ${cwd}: ${err.message}\n${stdout}\n${stderr}`));
      else resolve(stdout);
    });
  });
}

/**
 * Packs the package as a publisher would, from a copy of its tree beside a
 * copy of sql/: the install script is bundled there from sql/ by the
 * package's own script (so the other test files' copy is not rewritten
 * under them), the compiled code is the dist/src `npm run build` made
 * before the tests (prepack's other half), and npm pack writes the tarball.
 */
async function pack(dir: string, env: NodeJS.ProcessEnv): Promise<string> {
  const src = path.join(dir, "repo", "clients", "typescript");
  for (const f of ["package.json", "README.md", "src", "scripts", "dist/src"]) {
    cpSync(path.join(pkgDir, f), path.join(src, f), { recursive: true });
  }
  cpSync(path.join(repo, "sql"), path.join(dir, "repo", "sql"), { recursive: true });
  await run(process.execPath, ["scripts/bundle-sql.mjs"], src, env);
  await run("npm", ["pack", "--ignore-scripts", "--pack-destination", dir], src, env);
  const tgz = readdirSync(dir).find((f) => /^pgque-.*\.tgz$/.test(f));
  assert.ok(tgz, "npm pack wrote no pgque-*.tgz");
  return path.join(dir, tgz);
}

/** The DBA's one-time step: pgque's roles and the service's three logins; the owner owns the database. */
async function provision(db: TestDb, dbname: string): Promise<void> {
  // Roles are the cluster's: another test file's migrate() may create
  // pgque's at the same moment, so "already there" is success.
  const ensure = (name: string, ddl: string) =>
    db.pool.query(`do $$ begin if not exists (select from pg_roles where rolname = '${name}') then ${ddl}; end if;
      exception when duplicate_object or unique_violation then null; end $$`);
  for (const r of ["pgque_writer", "pgque_reader", "pgque_admin"]) await ensure(r, `create role ${r} nologin`);
  for (const r of ["files_owner", "files_app", "files_ticker"]) await ensure(r, `create role ${r} login`);
  await db.pool.query("grant pgque_writer, pgque_reader to files_app; grant pgque_admin to files_ticker");
  await db.pool.query(`alter database ${dbname} owner to files_owner`);
}

interface Service {
  port: number;
  child: ChildProcess;
  out: string[];
  exited: Promise<number | null>;
}

async function start(app: string, env: NodeJS.ProcessEnv): Promise<Service> {
  const child = spawn(process.execPath, ["dist/service.js"], { cwd: app, env, stdio: ["ignore", "pipe", "pipe"] });
  const out: string[] = [];
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  child.stderr!.on("data", (b: Buffer) => out.push(b.toString()));
  const port = await new Promise<number>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (l) => {
      out.push(l);
      const m = /^listening on (.*)$/.exec(l);
      if (m) resolve((JSON.parse(m[1]!) as { port: number }).port);
    });
    void exited.then((code) => reject(new Error(`the service exited with ${code} before listening:\n${out.join("\n")}`)));
  });
  return { port, child, out, exited };
}

/** Sends SIGTERM and waits for the service to exit on its own. */
async function terminate(s: Service): Promise<void> {
  s.child.kill("SIGTERM");
  const timer = setTimeout(() => s.child.kill("SIGKILL"), 30_000);
  const code = await s.exited;
  clearTimeout(timer);
  assert.equal(code, 0, `the service did not exit 0 after SIGTERM:\n${s.out.join("\n")}`);
  assert.ok(s.out.includes("stopped"), `the service did not report its graceful stop:\n${s.out.join("\n")}`);
}

type Change = { type: "FileCreated" | "FileOverwritten" | "FileDeleted"; path: string };

/** Request i of a tenant: mixed types, each path created, overwritten, then deleted by the next request. */
function changes(i: number): Change[] {
  const list: Change[] = [
    { type: "FileCreated", path: `f${i}` },
    { type: "FileOverwritten", path: `f${i}` },
  ];
  if (i > 0) list.push({ type: "FileDeleted", path: `f${i - 1}` });
  return list;
}

async function post(port: number, body: unknown): Promise<{ status: number; ids: string[] }> {
  const res = await fetch(`http://127.0.0.1:${port}/`, { method: "POST", body: JSON.stringify(body) });
  const text = await res.text();
  return { status: res.status, ids: res.status === 201 ? (JSON.parse(text) as string[]) : [] };
}

test("the example service produces in its transaction and consumes with work(), with no Go on the machine", async (t) => {
  const env = withoutGo();
  assert.notEqual(spawnSync("sh", ["-c", "command -v go"], { env }).status, 0, "go is still on PATH");
  const dir = mkdtempSync(path.join(tmpdir(), "pgque-example-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));

  const tgz = await pack(dir, env);
  const app = path.join(dir, "app");
  const example = path.join(repo, "examples", "typescript-service");
  cpSync(example, app, { recursive: true, filter: (f) => !/(^|\/)(node_modules|dist)(\/|$)/.test(path.relative(example, f)) });
  const manifest = JSON.parse(readFileSync(path.join(app, "package.json"), "utf8")) as { dependencies: Record<string, string> };
  manifest.dependencies.pgque = `file:${tgz}`;
  writeFileSync(path.join(app, "package.json"), JSON.stringify(manifest, null, 2));
  await run("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund"], app, env);
  await run("npm", ["run", "build"], app, env);

  const db = await testDb({ install: false, t });
  const dbname = decodeURIComponent(new URL(db.url).pathname.slice(1));
  await provision(db, dbname);
  const svcEnv = {
    ...env,
    MIGRATE_URL: db.urlAs("files_owner"),
    DATABASE_URL: db.urlAs("files_app"),
    TICKER_URL: db.urlAs("files_ticker"),
    PORT: "0",
  };

  const tenants = Array.from({ length: 8 }, (_, i) => `tenant-${i}`);
  const sent = new Map<string, { id: string; type: string }[]>(tenants.map((k) => [k, []]));
  const produce = (from: number, to: number) =>
    Promise.all(tenants.map(async (tenant) => {
      for (let i = from; i < to; i++) {
        const cs = changes(i);
        const r = await post(svc.port, { requestId: `${tenant}/${i}`, tenant, changes: cs });
        assert.equal(r.status, 201, `request ${tenant}/${i}`);
        assert.equal(r.ids.length, cs.length);
        sent.get(tenant)!.push(...r.ids.map((id, j) => ({ id, type: cs[j]!.type })));
      }
    }));
  const applied = async () => Number((await db.pool.query("select count(*) from applied")).rows[0].count);
  const total = () => [...sent.values()].reduce((n, l) => n + l.length, 0);

  // First run: a graceful stop while the stream is being applied.
  let svc = await start(app, svcEnv);
  t.after(() => {
    if (svc.child.exitCode === null) svc.child.kill("SIGKILL");
  });
  await produce(0, 5);
  await waitFor("the first events applied", async () => (await applied()) > 0, 20_000);
  await terminate(svc);
  const leases = await slots(db.pool, "files", "indexer");
  assert.equal(leases.length, 8);
  assert.deepEqual(leases.filter((s) => s.live), [], "a slot is still leased after the graceful stop");

  // Second run: migrate() again on the installed schema, more requests, and
  // one whose transaction rolls back after its sendBatch (a repeated
  // request id), in the middle of a tenant's stream.
  svc = await start(app, svcEnv);
  await produce(5, 8);
  const ghost = await post(svc.port, { requestId: "tenant-3/2", tenant: "tenant-3", changes: [{ type: "FileDeleted", path: "ghost" }] });
  assert.equal(ghost.status, 409, "the repeated request was not refused");
  await produce(8, 10);
  await waitFor(`all ${total()} committed events applied`, async () => (await applied()) >= total(), 30_000);

  // Every committed event once, each tenant's in the order sent; nothing
  // of the rolled-back request (its event would precede tenant-3's later ones).
  const { rows } = await db.pool.query<{ tenant: string; ev_id: string; type: string }>(
    "select tenant, ev_id::text, type from applied order by seq");
  assert.equal(rows.length, total(), "events applied more than once, or the rolled-back one arrived");
  for (const k of tenants) {
    assert.deepEqual(rows.filter((r) => r.tenant === k).map((r) => ({ id: r.ev_id, type: r.type })), sent.get(k), `tenant ${k}`);
  }
  const files = await db.pool.query("select tenant, path, version from files order by tenant, path");
  assert.deepEqual(files.rows, tenants.map((k) => ({ tenant: k, path: "f9", version: 2 })));
  await terminate(svc);
});
