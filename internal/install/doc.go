// Package install applies pgque's embedded SQL to a database.
//
// Install runs the whole install script (package sqlfiles) in one
// transaction, after taking a lock so that concurrent installers (several
// app instances starting at once) run one after the other instead of racing
// on catalog rows: a lock on pgque.version once installed (no stranger can
// take it), and a bounded wait for an advisory lock on a fresh database. The
// script refuses a schema pgque that another role owns or planted objects
// in (see sql/engine/structure/preflight.sql). The script is written
// idempotently, so the same call installs a fresh database and upgrades an
// existing one in place; the schema version it records in pgque.version is
// what InstalledVersion reads back.
//
// Install works for any role that may create a schema in the database (for
// instance the database owner) and may create the pgque_* roles, or finds
// them already created; it needs no superuser.
//
// Uninstall drops the pgque schema with everything in it and, when asked,
// the pgque_reader, pgque_writer and pgque_admin roles that nothing else
// uses any more.
package install
