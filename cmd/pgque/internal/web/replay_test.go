package web

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestConsoleReplayWarns: the replay action answers with a warning beside
// its result when the consumer had already been handed a later event of
// the dead letter's key (key k), and with none when not (key j).
func TestConsoleReplayWarns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.NewInstalledDB(t))
	client, err := pgque.NewClient(pool, &pgque.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	// Consumer w is handed k's two events and j's one; it dead-letters
	// the first of k and j's, and acknowledges the rest.
	var batch int64
	for _, sql := range []string{
		`select pgque.create_queue('files')`,
		`select pgque.subscribe('files', 'w')`,
		`select pgque.send('files', 't', '1'::jsonb, 'k'), pgque.send('files', 't', '2'::jsonb, 'k'), pgque.send('files', 't', '3'::jsonb, 'j')`,
		`select pgque.force_next_tick('files')`,
		`select pgque.ticker('files')`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if err := pool.QueryRow(ctx, `select max(batch_id) from pgque.receive('files', 'w', 10)`).Scan(&batch); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `select pgque.nack($1, 1, null, 'gone'), pgque.nack($1, 3, null, 'gone'), pgque.ack($1)`, batch); err != nil {
		t.Fatal(err)
	}
	dls, err := client.DeadLetters(ctx, "files", nil)
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters = %+v, %v; want two", dls, err)
	}
	hs := (&workload{pool: pool, client: client}).serve(t, true)
	good := map[string]string{"Content-Type": "application/json", TokenHeader: testToken, "Origin": hs.URL, "Sec-Fetch-Site": "same-origin"}
	replay := func(id int64) (res struct {
		Result  int64   `json:"result"`
		Warning *string `json:"warning"`
	}) {
		code, body, _ := do(t, "POST", hs.URL+"/api/actions/replay", good, `{"queue":"files","id":`+jsonInt(id)+`}`)
		if err := json.Unmarshal([]byte(body), &res); code != 200 || err != nil {
			t.Fatalf("replay %d: %d %s (%v)", id, code, body, err)
		}
		return res
	}
	if r := replay(dls[0].ID); r.Result != dls[0].EventID || r.Warning == nil ||
		*r.Warning != `event 1 (key "k") comes back to w after 1 later event(s) of its key it already had: it will be handled out of the key's order` {
		t.Errorf("replaying k's dead letter = %+v, want event %d with a warning", r, dls[0].EventID)
	}
	if r := replay(dls[1].ID); r.Result != dls[1].EventID || r.Warning != nil {
		t.Errorf("replaying j's dead letter = %+v, want event %d and no warning", r, dls[1].EventID)
	}
}
