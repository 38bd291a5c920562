/**
 * The pgque SQL schema version this package was built with: the version
 * sql/pgque.sql installs and the one the package's calls need in the
 * database. It moves with the Go library's SchemaVersion.
 */
export const SCHEMA_VERSION = "0.1.0";
