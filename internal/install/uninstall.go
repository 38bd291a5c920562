package install

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Roles are the cluster-wide roles the install script creates, in the order
// Uninstall drops them (pgque_admin may be a member of the others).
var Roles = []string{"pgque_admin", "pgque_writer", "pgque_reader"}

// sqlstateDependentObjects is dependent_objects_still_exist: DROP ROLE
// raises it while the role owns objects or holds privileges in any database.
const sqlstateDependentObjects = "2BP01"

// Uninstall drops the pgque schema and everything in it, in one transaction.
// With dropRoles it also drops each of Roles that nothing else uses: a role
// is kept while a role outside Roles is a member of it (an application's
// login role), or while it still holds privileges or owns objects anywhere
// in the cluster (pgque installed in another database). A membership that
// grants only ADMIN OPTION (PostgreSQL 16 and later) is no use: it is what
// a role with CREATEROLE receives on every role it creates, the installing
// owner on pgque's roles. Uninstalling where pgque is not installed is not
// an error.
func Uninstall(ctx context.Context, conn Conn, dropRoles bool) error {
	err := inTx(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "drop schema if exists pgque cascade"); err != nil {
			return err
		}
		if !dropRoles {
			return nil
		}
		for _, role := range Roles {
			if err := dropRoleIfUnused(ctx, tx, role); err != nil {
				return fmt.Errorf("dropping role %s: %w", role, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("uninstalling pgque: %w", err)
	}
	return nil
}

// dropRoleIfUnused drops role unless it is missing or still used.
func dropRoleIfUnused(ctx context.Context, tx pgx.Tx, role string) error {
	var exists, hasOutsideMembers bool
	err := tx.QueryRow(ctx, `select
		exists (select 1 from pg_catalog.pg_roles where rolname operator(pg_catalog.=) $1),
		exists (select 1 from pg_catalog.pg_auth_members m
			join pg_catalog.pg_roles g on g.oid operator(pg_catalog.=) m.roleid
			join pg_catalog.pg_roles r on r.oid operator(pg_catalog.=) m.member
			where g.rolname operator(pg_catalog.=) $1 and r.rolname operator(pg_catalog.<>) all ($2::pg_catalog.name[])
			  -- inherit_option and set_option exist from 16 on; before,
			  -- every membership confers the role's privileges.
			  and not (m.admin_option
			           and not coalesce((pg_catalog.to_jsonb(m) operator(pg_catalog.->>) 'inherit_option')::pg_catalog.bool, true)
			           and not coalesce((pg_catalog.to_jsonb(m) operator(pg_catalog.->>) 'set_option')::pg_catalog.bool, true)))`, role, Roles).
		Scan(&exists, &hasOutsideMembers)
	if err != nil || !exists || hasOutsideMembers {
		return err
	}
	// DROP ROLE checks every database's dependencies; try it in a savepoint
	// so that a role still in use elsewhere is kept without failing the rest.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := sp.Exec(ctx, "drop role "+pgx.Identifier{role}.Sanitize()); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == sqlstateDependentObjects {
			return sp.Rollback(ctx)
		}
		return errors.Join(err, sp.Rollback(context.WithoutCancel(ctx)))
	}
	return sp.Commit(ctx)
}
