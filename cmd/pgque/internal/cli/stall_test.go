package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// pgque status names a stalled slot, why it is stalled and what to do: slot
// 0 was claimed with a 1-second lease and never worked, so with events
// pending its lease expires and, two TTLs after the tick, the slot is
// stalled; slot 1 is consumed and gets no stall warning.
func TestStatusStalledSlot(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.ok("", "install")
	conn := c.conn()
	ctx := context.Background()
	for _, sql := range []string{
		"select pgque.create_queue('st')",
		"select pgque.subscribe_slot('st', 'c', s, 2) from generate_series(0, 1) s",
		"select pgque.claim_slot('st', 'c', 0, 'ghost', '1 second')",
		// The ghost's lease token for slot 1, kept in a session setting.
		"select pg_catalog.set_config('pgque_test.ghost', (select token::text from pgque.claim_slot('st', 'c', 1, 'ghost', '1 second')), false)",
		"select pgque.send('st', 't', '{}'::jsonb, 'tenant-3')",
		"select pgque.force_next_tick('st')",
		"select pgque.ticker('st')",
		// Slot 1 catches up and its owner goes away: idle, not stalled.
		"select count(*) from pgque.receive_partitioned('st', 'c', 1, 2, 'ghost', pg_catalog.current_setting('pgque_test.ghost')::uuid, 100)",
		"select pgque.release_slot('st', 'c', 1, 'ghost', pg_catalog.current_setting('pgque_test.ghost')::uuid)",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if slot := c.slotOf("tenant-3", 2); slot != 0 {
		t.Fatalf("tenant-3 maps to slot %d of 2; the fixture needs it on slot 0", slot)
	}
	var rep statusReport
	pgtest.WaitFor(t, 20*time.Second, "a stall warning for slot 0", func() bool {
		c.okJSON(&rep, "status", "st", "--json")
		for _, w := range rep.Warnings {
			if strings.Contains(w, "slot 0/2: stalled for") {
				return true
			}
		}
		return false
	})
	text := strings.Join(rep.Warnings, "\n")
	for _, want := range []string{"lease expired", "no live owner", "pins rotation", "start a worker"} {
		if !strings.Contains(text, want) {
			t.Errorf("status warnings:\n%s\nwant %q", text, want)
		}
	}
	if strings.Contains(text, "slot 1/2: stalled") {
		t.Errorf("the caught-up slot 1 is reported stalled:\n%s", text)
	}
	out := c.ok("", "status", "st")
	if !strings.Contains(out, "slot 0/2: stalled for") {
		t.Errorf("pgque status does not show the stall:\n%s", out)
	}
}
