package install

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestLocateNamesFileAndLine(t *testing.T) {
	t.Parallel()
	script := "-- head\n" +
		"\n-- ==== engine/a.sql ====\nselect 'héllo, wörld';\n\n" +
		"\n-- ==== api/b.sql ====\nselect 1;\n-- ünïcode\nselect nosuchcol;\n"
	pos := len([]rune(script[:strings.Index(script, "nosuchcol")])) + 1
	pgErr := &pgconn.PgError{Code: "42703", Message: "column does not exist", Position: int32(pos)}

	err := locate(script, pgErr)
	if want := "api/b.sql line 3: "; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("locate() = %q, want it to start with %q", err, want)
	}
	var got *pgconn.PgError
	if !errors.As(err, &got) || got != pgErr {
		t.Errorf("locate() lost the *pgconn.PgError: %v", err)
	}
}

func TestLocateWithoutPosition(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		errors.New("connection reset"),
		&pgconn.PgError{Message: "no position"},
		&pgconn.PgError{Message: "past the end", Position: 1 << 20},
		&pgconn.PgError{Message: "before any file", Position: 2},
	} {
		if got := locate("-- head\n\n-- ==== a.sql ====\nselect 1;\n", err); got != err {
			t.Errorf("locate(%v) = %v, want the error unchanged", err, got)
		}
	}
}
