package pgque

import (
	"context"
	"fmt"
	"time"
)

// AttachOptions are the options of AttachTable. The zero value emits an
// event for every INSERT, UPDATE and DELETE with the whole row, and skips
// updates that change nothing.
type AttachOptions struct {
	// Operations lists what emits events: "insert", "update", "delete",
	// "truncate". Empty means insert, update and delete (a TRUNCATE of the
	// table is then refused, since it would emit nothing).
	Operations []string
	// Columns keeps only these columns in the payload; ExcludeColumns
	// leaves these out. At most one of the two may be set.
	Columns, ExcludeColumns []string
	// When is an SQL condition on NEW/OLD, as in CREATE TRIGGER ... WHEN.
	When string
	// KeepUnchanged emits updates that change no kept column too.
	KeepUnchanged bool
}

// AttachTable makes every write to table emit an event into queue, from a
// trigger in the writing transaction, with keyColumn's value as the
// partition key (see docs/triggers.md). Attaching again replaces the
// options. It runs with the caller's rights: the caller needs the TRIGGER
// privilege on the table and pgque_admin; the table's writers need no pgque
// grant.
func (c *Client) AttachTable(ctx context.Context, queue, table, keyColumn string, opts *AttachOptions) error {
	var o AttachOptions
	if opts != nil {
		o = *opts
	}
	if len(o.Columns) > 0 && len(o.ExcludeColumns) > 0 {
		return invalidConfig("AttachOptions.Columns and ExcludeColumns cannot both be set")
	}
	var when *string
	if o.When != "" {
		when = &o.When
	}
	err := c.queries.AttachTable(ctx, queue, table, keyColumn, emptyAsNil(o.Operations), emptyAsNil(o.Columns),
		emptyAsNil(o.ExcludeColumns), when, !o.KeepUnchanged)
	return mapError(fmt.Sprintf("attaching table %s to queue %q", table, queue), err)
}

// DetachTable removes table's triggers for queue: its writes emit nothing
// more; events already sent stay. It fails with ErrTableNotAttached when
// the table is not attached to the queue.
func (c *Client) DetachTable(ctx context.Context, queue, table string) error {
	return mapError(fmt.Sprintf("detaching table %s from queue %q", table, queue), c.queries.DetachTable(ctx, queue, table))
}

// TableAttachment is one table attached to a queue.
type TableAttachment struct {
	Queue string
	// Table is schema.table, "" when the table was dropped (the attachment
	// is then forgotten by the next maint()).
	Table                   string
	KeyColumn               string
	Operations              []string
	Columns, ExcludeColumns []string
	When                    string
	SkipUnchanged           bool
	Attached                time.Time
}

// AttachedTables lists every table attached to a queue, by queue and table.
func (c *Client) AttachedTables(ctx context.Context) ([]TableAttachment, error) {
	rows, err := c.queries.AttachedTables(ctx)
	if err != nil {
		return nil, mapError("listing attached tables", err)
	}
	out := make([]TableAttachment, len(rows))
	for i, r := range rows {
		out[i] = TableAttachment{Queue: r.Queue, Table: deref(r.Table), KeyColumn: r.KeyColumn, Operations: r.Operations,
			Columns: r.Columns, ExcludeColumns: r.ExcludeColumns, When: deref(r.When), SkipUnchanged: r.SkipUnchanged,
			Attached: r.Attached}
	}
	return out, nil
}

func emptyAsNil(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}
