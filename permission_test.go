package pgque_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestPermissionErrorsNameTheRoles: PostgreSQL's permission errors name
// what was refused (a function, schema pgque), not the pgque role that
// grants it. A login given a consumer's role that sends, and one given no
// pgque role, get ErrPermissionDenied with the roles named, so they learn
// what to grant.
func TestPermissionErrorsNameTheRoles(t *testing.T) {
	env := setup(t)
	ctx := context.Background()
	su := pgtest.Conn(t, env.dsn)
	n := queueSeq.Add(1)
	reader := fmt.Sprintf("perm_reader_%d_%d", os.Getpid(), n)
	stranger := fmt.Sprintf("perm_none_%d_%d", os.Getpid(), n)
	mustExec(t, su, "create role "+reader+" login in role pgque_reader", "create role "+stranger+" login")
	t.Cleanup(func() {
		for _, r := range []string{reader, stranger} {
			_, _ = su.Exec(context.Background(), "drop role if exists "+r)
		}
	})
	for _, c := range []struct{ role, refused string }{
		{reader, "permission denied for function"},
		{stranger, "permission denied for schema pgque"},
	} {
		pool := pgtest.Pool(t, pgtest.DSNWith(env.dsn, "user", c.role))
		client, err := pgque.NewClient(pool, nil)
		if err == nil {
			_, err = client.Send(ctx, env.queue, pgque.Event{Type: "t", Payload: map[string]int{"n": 1}})
		}
		if !errors.Is(err, pgque.ErrPermissionDenied) {
			t.Fatalf("%s: Send = %v, want ErrPermissionDenied", c.role, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, c.refused) || !strings.Contains(msg, "pgque_writer may send") {
			t.Errorf("%s: %q does not say what was refused (%q) and which role sends", c.role, msg, c.refused)
		}
		pool.Close()
	}
}
