package demo

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// verify runs every check against the database and the producers' expected
// state, recording them in res.
func verify(ctx context.Context, pool *pgxpool.Pool, o *Options, expected map[string]*tenantGen, ws *workers, res *Result) error {
	applied, err := appliedLog(ctx, pool)
	if err != nil {
		return err
	}
	checkExactlyOnce(expected, applied, res)
	checkOrder(applied, res)
	if err := checkState(ctx, pool, expected, res); err != nil {
		return err
	}
	if n := ws.overlaps.Load(); n > 0 {
		res.fail("one worker per tenant", fmt.Sprintf("%d times a worker received a tenant's event while another worker was handling that tenant", n))
	} else {
		res.pass("one worker per tenant", fmt.Sprintf("no two workers ever handled one tenant at once (%d worker processes)", o.Workers))
	}
	dead, err := deadLetters(ctx, pool)
	if err != nil {
		return fmt.Errorf("counting dead letters: %w", err)
	}
	if dead > 0 {
		res.fail("no dead letters", fmt.Sprintf("%d events were dead-lettered", dead))
	} else {
		res.pass("no dead letters", "no event was dead-lettered")
	}
	return nil
}

// application is one row of pgque_demo.applied.
type application struct {
	tenant string
	seq    int
	retry  int
}

// appliedLog reads every application, per tenant in the order applied.
func appliedLog(ctx context.Context, pool *pgxpool.Pool) ([]application, error) {
	rows, err := pool.Query(ctx, `select tenant, seq, retry from pgque_demo.applied order by tenant, id`)
	if err != nil {
		return nil, fmt.Errorf("reading the applied log: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (application, error) {
		var a application
		err := r.Scan(&a.tenant, &a.seq, &a.retry)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading the applied log: %w", err)
	}
	return out, nil
}

// checkExactlyOnce: every (tenant, seq) sent was applied exactly once, and
// nothing else was applied.
func checkExactlyOnce(expected map[string]*tenantGen, applied []application, res *Result) {
	counts := make(map[string]map[int]int, len(expected))
	var unexpected []string
	for _, a := range applied {
		g, ok := expected[a.tenant]
		if !ok || a.seq < 1 || a.seq > g.sent {
			unexpected = append(unexpected, fmt.Sprintf("%s seq %d", a.tenant, a.seq))
			continue
		}
		if counts[a.tenant] == nil {
			counts[a.tenant] = map[int]int{}
		}
		counts[a.tenant][a.seq]++
	}
	var missing, twice []string
	total := 0
	for _, t := range sortedKeys(expected) {
		for seq := 1; seq <= expected[t].sent; seq++ {
			total++
			switch n := counts[t][seq]; {
			case n == 0:
				missing = append(missing, fmt.Sprintf("%s seq %d", t, seq))
			case n > 1:
				twice = append(twice, fmt.Sprintf("%s seq %d (%d times)", t, seq, n))
			default:
				res.Applied++
			}
		}
	}
	if len(missing)+len(twice)+len(unexpected) == 0 {
		res.pass("exactly once", fmt.Sprintf("all %d events applied exactly once", total))
		return
	}
	res.fail("exactly once", fmt.Sprintf("%d of %d applied once; missing %d%s; applied more than once %d%s; unexpected %d%s",
		res.Applied, total, len(missing), first(missing), len(twice), first(twice), len(unexpected), first(unexpected)))
}

// checkOrder: in a strict run every tenant's applications are exactly
// 1, 2, ..., n in order. In a lenient run, an application that came after a
// later event of its tenant (a reorder) is allowed only for an event that
// was retried: a first delivery never overtakes anything.
func checkOrder(applied []application, res *Result) {
	var bad []string
	tenants, reorders := 0, 0
	prev, pos, maxSeq := "", 0, 0
	for _, a := range applied {
		if a.tenant != prev {
			prev, pos, maxSeq = a.tenant, 0, 0
			tenants++
		}
		pos++
		reordered := a.seq < maxSeq
		maxSeq = max(maxSeq, a.seq)
		switch {
		case res.Strict && a.seq != pos:
			bad = append(bad, fmt.Sprintf("%s applied seq %d as its #%d", a.tenant, a.seq, pos))
		case reordered && a.retry == 0:
			bad = append(bad, fmt.Sprintf("%s seq %d overtaken without a retry", a.tenant, a.seq))
		case reordered:
			reorders++
		}
	}
	res.Reorders = reorders
	switch {
	case len(bad) > 0:
		res.fail("per-tenant order", fmt.Sprintf("%d applications out of order%s", len(bad), first(bad)))
	case res.Strict:
		res.pass("per-tenant order", fmt.Sprintf("every tenant's applied sequence is 1..n, no gap or reorder (%d tenants)", tenants))
	default:
		res.pass("per-tenant order", fmt.Sprintf("%d applications overtaken after a retry (allowed under policy %s); no other reorder (%d tenants)",
			reorders, res.Policy, tenants))
	}
}

// checkState: the final state of every file equals the producers'.
func checkState(ctx context.Context, pool *pgxpool.Pool, expected map[string]*tenantGen, res *Result) error {
	rows, err := pool.Query(ctx, `select tenant, file, version, deleted from pgque_demo.files`)
	if err != nil {
		return fmt.Errorf("reading the final state: %w", err)
	}
	got := map[[2]string]fileState{}
	var t, f string
	var st fileState
	_, err = pgx.ForEachRow(rows, []any{&t, &f, &st.Version, &st.Deleted}, func() error {
		got[[2]string{t, f}] = st
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading the final state: %w", err)
	}
	var diffs []string
	want := 0
	for _, tenant := range sortedKeys(expected) {
		files, err := expected[tenant].expected()
		if err != nil {
			return fmt.Errorf("the producer generated an invalid lifecycle: %w", err)
		}
		for _, file := range sortedKeys(files) {
			want++
			w := files[file]
			k := [2]string{tenant, file}
			if have, ok := got[k]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s/%s missing", tenant, file))
			} else if have != w {
				diffs = append(diffs, fmt.Sprintf("%s/%s is %s, want %s", tenant, file, have, w))
			}
			delete(got, k)
		}
	}
	for k := range got {
		diffs = append(diffs, fmt.Sprintf("%s/%s should not exist", k[0], k[1]))
	}
	res.Files = want
	if len(diffs) > 0 {
		slices.Sort(diffs)
		res.fail("final state", fmt.Sprintf("%d of %d files differ from the producers' state%s", len(diffs), want, first(diffs)))
	} else {
		res.pass("final state", fmt.Sprintf("all %d files match the producers' state", want))
	}
	return nil
}

func (s fileState) String() string {
	if s.Deleted {
		return fmt.Sprintf("v%d deleted", s.Version)
	}
	return fmt.Sprintf("v%d", s.Version)
}

// first renders the first example of a list.
func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return " (first: " + s[0] + ")"
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
