package dbq

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// AttachTable calls pgque.attach_table(queue, table, key_column,
// operations, columns, exclude_columns, when_condition, skip_unchanged).
// A nil slice or string is SQL NULL (the function's default).
func (q *Queries) AttachTable(ctx context.Context, queue, table, keyColumn string, ops, columns, exclude []string,
	when *string, skipUnchanged bool) error {
	_, err := q.db.Exec(ctx, `select pgque.attach_table($1::pg_catalog.text, $2::pg_catalog.regclass, $3::pg_catalog.text,
			coalesce($4::pg_catalog.text[], array['insert', 'update', 'delete']), $5::pg_catalog.text[],
			$6::pg_catalog.text[], $7::pg_catalog.text, $8::pg_catalog.bool)`,
		queue, table, keyColumn, ops, columns, exclude, when, skipUnchanged)
	return err
}

// DetachTable calls pgque.detach_table(queue, table).
func (q *Queries) DetachTable(ctx context.Context, queue, table string) error {
	_, err := q.db.Exec(ctx, `select pgque.detach_table($1::pg_catalog.text, $2::pg_catalog.regclass)`, queue, table)
	return err
}

// AttachedTable is one row of pgque.attached_tables().
type AttachedTable struct {
	Queue          string
	Table          *string
	KeyColumn      string
	Operations     []string
	Columns        []string
	ExcludeColumns []string
	When           *string
	SkipUnchanged  bool
	Attached       time.Time
}

// AttachedTables calls pgque.attached_tables().
func (q *Queries) AttachedTables(ctx context.Context) ([]AttachedTable, error) {
	rows, err := q.db.Query(ctx, `select queue, source_table, key_column, operations, columns, exclude_columns,
			when_condition, skip_unchanged, attached from pgque.attached_tables()`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[AttachedTable])
}

// DedupWindow reads queue's dedup_window (the default when it never set
// one); ok is false for an unknown queue.
func (q *Queries) DedupWindow(ctx context.Context, queue string) (window time.Duration, ok bool, err error) {
	err = q.db.QueryRow(ctx, `select coalesce(queue_dedup_window, interval '5 minutes')
		from pgque.queue where queue_name operator(pg_catalog.=) $1::pg_catalog.text`, queue).Scan(&window)
	if err == pgx.ErrNoRows {
		return 0, false, nil
	}
	return window, err == nil, err
}
