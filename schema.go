package pgque

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque/internal/install"
	sqlfiles "github.com/pgque/pgque/sql"
)

// SchemaVersion is the version of pgque's SQL schema this library was built
// with. A database must hold exactly this version (install or upgrade it
// with package pgquemigrate or `pgque upgrade`).
const SchemaVersion = sqlfiles.Version

// SchemaVersionError reports that the database holds another pgque schema
// version than the library's. It unwraps to ErrSchemaVersion.
type SchemaVersionError struct {
	// Installed is the database's version; "unknown" for a schema older than
	// pgque.version().
	Installed string
	// Want is SchemaVersion.
	Want string
}

// Error says which side is older and what to do.
func (e *SchemaVersionError) Error() string {
	return fmt.Sprintf("pgque: the database has pgque schema %s, this library needs %s "+
		"(upgrade the database with pgquemigrate.Install or 'pgque upgrade', or use the matching library)", e.Installed, e.Want)
}

// Unwrap returns ErrSchemaVersion.
func (e *SchemaVersionError) Unwrap() error { return ErrSchemaVersion }

// InstalledSchemaVersion returns the schema version installed in the
// database. It fails with ErrNotInstalled when pgque is not installed, and
// with ErrPermissionDenied, before calling anything, when schema pgque
// belongs to a role that lacks a right the caller has (a superuser's client
// over a schema another role prepared: see pgquemigrate.TrustSchema). Every
// pgque role may call it (through pgque.version()).
func (c *Client) InstalledSchemaVersion(ctx context.Context) (string, error) {
	if err := install.TrustSchema(ctx, c.pool); err != nil {
		return "", mapError("reading the pgque schema version", err)
	}
	v, err := c.queries.SchemaVersion(ctx)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "3F000": // invalid_schema_name: no pgque schema
		return "", fmt.Errorf("reading the pgque schema version: %w", ErrNotInstalled)
	case errors.As(err, &pgErr) && pgErr.Code == "42883": // undefined_function: a schema from before version()
		return "unknown", nil
	case err != nil:
		return "", mapError("reading the pgque schema version", err)
	case v == nil:
		return "", fmt.Errorf("reading the pgque schema version: %w", ErrNotInstalled)
	}
	return *v, nil
}

// CheckSchema fails with a *SchemaVersionError (ErrSchemaVersion) when the
// database's pgque schema is another version than SchemaVersion, and with
// ErrNotInstalled when pgque is not installed. Connect and the Start method
// of every service call it; a success is remembered for the client's life.
func (c *Client) CheckSchema(ctx context.Context) error {
	if c.schemaChecked.Load() {
		return nil
	}
	v, err := c.InstalledSchemaVersion(ctx)
	if err != nil {
		return err
	}
	if v != SchemaVersion {
		return &SchemaVersionError{Installed: v, Want: SchemaVersion}
	}
	c.schemaChecked.Store(true)
	return nil
}
