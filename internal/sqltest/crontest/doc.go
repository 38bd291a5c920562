// Package crontest checks that pgque can tick from inside the database with
// pg_cron (pgque.start / pgque.stop / pgque.run_ticker), on a private
// cluster that preloads the extension.
package crontest
