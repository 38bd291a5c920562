// Package pgtest is the test harness: it gives every test its own real
// PostgreSQL database, never a mock.
//
// One server serves a whole test binary. By default it is a throwaway
// cluster (package pgcluster) started on first use and stopped when the
// tests end; a package opts in by calling Main from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// When PGQUE_TEST_DSN is set, tests use that server instead: every test
// database is created on it (the role needs CREATEDB) and dropped after the
// test. When neither works (no DSN and no server binaries on the machine),
// tests fail with instructions; they never skip silently.
//
// NewDB returns an empty database, NewInstalledDB one with pgque installed.
// The latter is a copy of a template database into which pgque is installed
// once per test binary, which is far faster than running the install script
// for every test. Settings made with ALTER DATABASE ... SET are not copied by
// CREATE DATABASE, so the install script must not rely on them.
//
// The cluster runs the build that PGQUE_PG_VERSION or PGQUE_PG_BINDIR
// chooses (see package pgcluster). Tests that need an extension some builds
// lack call SkipWithoutExtension, which skips them naming the version.
//
// Tests that crash or restart the server get a private cluster from
// NewCluster, so they never disturb the tests running beside them.
package pgtest
