// pgque for Node.js: the package's public API.

export type { Executor, QueryResult, ConnectionSource, PooledConnection, PostgresJsLike } from "./executor.js";
export { fromPostgresJs } from "./executor.js";
export type { ErrorKind } from "./errors.js";
export { PgqueError, SchemaVersionError, isPgqueError, kindOf, mapError } from "./errors.js";
export type { MigrateResult } from "./migrate.js";
export { migrate, installedVersion, checkSchema, installScript } from "./migrate.js";
export { SCHEMA_VERSION } from "./version.js";
export * from "./worker/index.js";
