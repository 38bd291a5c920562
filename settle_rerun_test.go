package pgque_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestSettleRunsAgainAfterARollback: a chunk's settle that the server
// rolls back as a deadlock victim (40P01; here a trigger on the retry
// queue refuses the first nack so) runs again instead of leaving the
// chunk to be delivered again: k#1 fails once and is retried, k#2 runs
// once. With key lanes and without.
func TestSettleRunsAgainAfterARollback(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 4} {
		t.Run(map[int]string{1: "inline", 4: "lanes"}[workers], func(t *testing.T) {
			t.Parallel()
			env := setup(t)
			ctx := context.Background()
			if _, err := env.pool.Exec(ctx, `
				create sequence public.nacks;
				create function public.deadlock_first_nack() returns trigger language plpgsql as $$
				begin
				    if nextval('public.nacks') = 1 then
				        raise exception using errcode = '40P01', message = 'deadlock injected by the test';
				    end if;
				    return new;
				end $$;
				create trigger deadlock_first_nack before insert on pgque.retry_queue
				    for each row execute function public.deadlock_first_nack()`); err != nil {
				t.Fatal(err)
			}
			startTicker(t, env.client)
			var log pauseLog
			startProcess(t, env, pgque.PartitionedConsumerConfig{
				Queue: env.queue, Consumer: "c", Slots: 1, MaxWorkersPerSlot: workers,
				PollInterval: 100 * time.Millisecond,
				RetryDelay:   func(int) time.Duration { return 50 * time.Millisecond },
				Handler: pauseHandler(&log, "w", func(m *pgque.Message, p pmsg) error {
					if p.N == 1 && m.RetryCount == 0 {
						return errors.New("k#1 fails on its first attempt")
					}
					return nil
				}),
			})
			ids := sendKevs(t, env, kev{"k", 1}, kev{"k", 2})
			pgtest.WaitFor(t, 20*time.Second, "k#1 and k#2", func() bool { return log.done(ids) })
			// The retry is the last call: nothing after it can come.
			wantCalls(t, &log, "k", "#1 FAIL r0", "#2 ok r0", "#1 ok r1")
			var nacks int64
			if err := env.pool.QueryRow(ctx, "select last_value from public.nacks").Scan(&nacks); err != nil {
				t.Fatal(err)
			}
			if nacks != 2 {
				t.Errorf("the retry queue was written %d times, want 2 (the refused nack and its second run)", nacks)
			}
		})
	}
}
