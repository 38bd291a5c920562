package demo

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
)

// sourceSQL creates the table the producers write in a --source trigger
// run: the storage service's own file rows. A file is created by INSERT,
// overwritten by UPDATE of version, and deleted by setting deleted (a
// soft delete, as such services keep the row): each write carries the
// tenant's sequence number, so the row the trigger emits is a complete
// workload event.
const sourceSQL = `
create table pgque_demo.source_files (
    tenant  text not null,
    file    text not null,
    version integer not null,
    seq     integer not null,
    deleted boolean not null default false,
    primary key (tenant, file)
);
select pgque.attach_table('pgque_demo', 'pgque_demo.source_files', 'tenant');
`

// attachSource creates pgque_demo.source_files and attaches it to the
// demo's queue, keyed by tenant.
func attachSource(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, sourceSQL); err != nil {
		return fmt.Errorf("attaching the source table: %w", err)
	}
	return nil
}

// sourceRow is a source_files row as the trigger emits it.
type sourceRow struct {
	payload
	Deleted bool `json:"deleted"`
}

// eventType maps the trigger's operation back to the workload's event.
func (r sourceRow) eventType(op string) (string, error) {
	switch {
	case op == "insert":
		return TypeCreated, nil
	case op == "update" && r.Deleted:
		return TypeDeleted, nil
	case op == "update":
		return TypeOverwritten, nil
	}
	return "", fmt.Errorf("unexpected %s event from the source table", op)
}

// writeRows performs the batch's events as writes to source_files in one
// transaction and returns the ids of the events the trigger emitted (read
// back by transaction id, for the latency figures), in write order.
func writeRows(ctx context.Context, pool *pgxpool.Pool, batch []pgque.Event) ([]int64, error) {
	var ids []int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var b pgx.Batch
		for _, ev := range batch {
			p := ev.Payload.(payload)
			switch ev.Type {
			case TypeCreated:
				b.Queue(`insert into pgque_demo.source_files (tenant, file, version, seq) values ($1, $2, $3, $4)`,
					p.Tenant, p.File, p.Version, p.Seq)
			case TypeOverwritten:
				b.Queue(`update pgque_demo.source_files set version = $3, seq = $4 where tenant = $1 and file = $2`,
					p.Tenant, p.File, p.Version, p.Seq)
			case TypeDeleted:
				b.Queue(`update pgque_demo.source_files set deleted = true, seq = $3 where tenant = $1 and file = $2`,
					p.Tenant, p.File, p.Seq)
			}
		}
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return err
		}
		rows, _ := tx.Query(ctx, `select ev_id from pgque.event where ev_txid = pg_current_xact_id() order by ev_id`)
		var err error
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		if err == nil && len(ids) != len(batch) {
			err = fmt.Errorf("%d writes emitted %d events", len(batch), len(ids))
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("writing source rows: %w", err)
	}
	return ids, nil
}
