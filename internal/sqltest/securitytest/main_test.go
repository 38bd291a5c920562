// Package securitytest holds pgque's bad-input, injection and privilege
// tests against a real PostgreSQL: every public SQL function with NULLs,
// bad names, invalid bytes and absurd values; the role matrix; hostile
// objects in schema public; and fuzzing of names and keys through the
// database.
package securitytest

import (
	"testing"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
