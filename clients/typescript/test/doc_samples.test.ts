// The TypeScript samples of the READMEs, docs/typescript.md and
// docs/pg-boss.md compile against the package's declarations, so a
// newcomer who copies one gets no error the docs did not warn of. Each
// ```ts block becomes a module of its own under dist/doc-samples (inside
// the package, so "pgque" resolves to the package itself as it does in a
// project that installed it); the names a sample leaves to the reader
// (`apply`, `tenant`, ...) are declared in a prelude, and the pg-boss half
// of a side-by-side block is left out.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const pkgDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const repo = path.resolve(pkgDir, "../..");
const docs = ["README.md", "clients/typescript/README.md", "docs/typescript.md", "docs/pg-boss.md"];

/** What samples use without defining: declared unless the sample defines it. */
const placeholders: Record<string, string> = {
  pool: "declare const pool: pg.Pool;",
  client: "declare const client: pg.PoolClient;",
  db: "declare const db: Kysely<DB>;",
  DB: "type DB = any;",
  order: "declare const order: { tenant: string } & Record<string, unknown>;",
  tenant: "declare const tenant: string;",
  path: "declare const path: string;",
  size: "declare const size: number;",
  queue: "declare const queue: string;",
  ev: "declare const ev: Event;",
  events: "declare const events: unknown[];",
  apply: "declare function apply(...args: unknown[]): Promise<void>;",
  url: "declare function url(payload: unknown): string;",
  server: 'declare const server: import("node:http").Server;',
  worker: 'declare const worker: import("pgque").Worker;',
  ticker: 'declare const ticker: InstanceType<typeof import("pgque").Ticker>;',
  handler: 'declare const handler: import("pgque").Handler;',
  handlerSeconds: "declare const handlerSeconds: { observe(seconds: number): void };",
  lagGauge: "declare const lagGauge: { set(labels: object, value: number): void };",
};

interface Sample {
  doc: string;
  line: number;
  code: string;
}

/** The ```ts blocks of a document, with the pg-boss lines of side-by-side blocks removed. */
function samples(doc: string): Sample[] {
  const lines = readFileSync(path.join(repo, doc), "utf8").split("\n");
  const out: Sample[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (lines[i]!.trim() !== "```ts") continue;
    const start = i + 1;
    const body: string[] = [];
    let boss = false;
    for (i++; i < lines.length && lines[i]!.trim() !== "```"; i++) {
      const l = lines[i]!;
      if (/^\/\/ pg-boss\b/.test(l)) boss = true;
      else if (/^\/\/ pgque\b/.test(l)) boss = false;
      // Keep line numbers: a left-out line becomes an empty one.
      body.push(boss ? "" : l);
    }
    out.push({ doc, line: start + 1, code: body.join("\n") });
  }
  return out;
}

/** The package's type-only exports a sample may use after the docs' import line. */
const typeNames = ["Executor", "Event", "Message", "HandlerContext", "HandleResult", "WorkOptions", "Worker", "WorkerStats", "FailurePolicy"];

/**
 * The sample as a module: the package's names it uses but does not import
 * itself (the docs import them once, at the top), the placeholders it does
 * not define, then its own text.
 */
function prelude(code: string, values: string[]): string {
  const own = new Set((code.match(/\bimport\s*(?:type\s*)?\{[^}]*\}\s*from\s*"pgque"/g) ?? [])
    .flatMap((m) => m.slice(m.indexOf("{") + 1, m.indexOf("}")).split(",").map((n) => n.replace(/\btype\b/, "").trim())));
  const uses = (name: string) => !own.has(name) && new RegExp(`\\b${name}\\b`).test(code);
  const head: string[] = ["export {};"];
  if (!/^import pg from "pg";$/m.test(code)) head.push('import pg from "pg";');
  if (/\bKysely\b|\bDB\b/.test(code)) head.push('import type { Kysely } from "kysely";');
  const vals = values.filter(uses);
  if (vals.length > 0) head.push(`import { ${vals.join(", ")} } from "pgque";`);
  const types = typeNames.filter(uses);
  if (types.length > 0) head.push(`import type { ${types.join(", ")} } from "pgque";`);
  for (const [name, decl] of Object.entries(placeholders)) {
    const defined = new RegExp(`\\b(const|let|function|type)\\s+${name}\\b`).test(code);
    if (!defined && new RegExp(`\\b${name}\\b`).test(code)) head.push(decl);
  }
  return `${head.join(" ")}\n${code}`;
}

function tsc(cwd: string): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [path.join(pkgDir, "node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json"], { cwd, maxBuffer: 1 << 24 },
      (err, stdout, stderr) => resolve({ code: err ? (typeof err.code === "number" ? err.code : 1) : 0, out: stdout + stderr }));
  });
}

test("the docs' TypeScript samples compile against the package", async () => {
  const dir = path.join(pkgDir, "dist", "doc-samples");
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const values = Object.keys(await import("../src/index.js"));
  const all = docs.flatMap(samples);
  assert.ok(all.length >= 10, `only ${all.length} samples found`);
  const where = new Map<string, Sample>();
  all.forEach((s, i) => {
    const file = `sample${i}.ts`;
    where.set(file, s);
    writeFileSync(path.join(dir, file), prelude(s.code, values));
  });
  writeFileSync(path.join(dir, "tsconfig.json"), JSON.stringify({
    compilerOptions: {
      target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, noEmit: true,
      skipLibCheck: true, types: ["node"], allowUnreachableCode: true,
    },
    include: ["*.ts"],
  }));
  const r = await tsc(dir);
  // Point each error at the document and line it comes from (the prelude is line 1).
  const report = r.out.replace(/^(sample\d+\.ts)\((\d+),(\d+)\)/gm, (_, f: string, l: string, c: string) => {
    const s = where.get(f)!;
    return `${s.doc}:${s.line + Number(l) - 2}:${c}`;
  });
  assert.equal(r.code, 0, `doc samples do not compile:\n${report}`);
  rmSync(dir, { recursive: true, force: true });
});
