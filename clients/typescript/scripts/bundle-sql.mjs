// Writes sql/pgque.sql, the install script migrate() applies, from the
// repository's sql/ folder: the files named by sql/install.list, in order,
// framed exactly as the Go installer frames them (`pgque sql`). The script
// is built, not checked in, so sql/ stays its only source; `make lint`
// compares this output with `pgque sql` byte for byte. It also copies
// sql/client/*.sql, the queries the clients run before they trust the
// schema, to sql/client/.
//
// Usage: node scripts/bundle-sql.mjs [OUT]   (OUT "-" is standard output)

import { readdirSync, readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = join(here, "..");
const sqlDir = join(pkg, "..", "..", "sql");

const versionSource = readFileSync(join(pkg, "src", "version.ts"), "utf8");
const m = /export const SCHEMA_VERSION = "([^"]+)"/.exec(versionSource);
if (!m) {
  throw new Error("src/version.ts declares no SCHEMA_VERSION");
}
const version = m[1];

const parts = [
  `-- pgque ${version} install script; apply in one transaction (psql -1 -f).\n`,
  "set local client_min_messages = warning;\n",
];
for (const raw of readFileSync(join(sqlDir, "install.list"), "utf8").split("\n")) {
  const name = raw.trim();
  if (name === "" || name.startsWith("#")) continue;
  parts.push(`\n-- ==== ${name} ====\n${readFileSync(join(sqlDir, name), "utf8")}\n`);
}
parts.push(`\n-- ==== version ====\nselect pgque._record_version('${version}');\n`);
const script = parts.join("");

const out = process.argv[2] ?? join(pkg, "sql", "pgque.sql");
if (out === "-") {
  process.stdout.write(script);
} else {
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, script);
  // The queries the clients run before they trust schema pgque, as the Go
  // client embeds them (sqlfiles.ClientQuery).
  const clientOut = join(dirname(out), "client");
  mkdirSync(clientOut, { recursive: true });
  for (const name of readdirSync(join(sqlDir, "client"))) {
    if (name.endsWith(".sql")) writeFileSync(join(clientOut, name), readFileSync(join(sqlDir, "client", name)));
  }
}
