package pgque

import (
	"encoding/json"
	"strings"
	"testing"
)

func waitingReq(queue, typ string, payload string) *sendReq {
	return &sendReq{queue: queue, typ: typ, payload: json.RawMessage(payload)}
}

// names lists the payloads of reqs, for comparing batches.
func names(reqs []*sendReq) string {
	var out []string
	for _, r := range reqs {
		out = append(out, string(r.payload))
	}
	return strings.Join(out, " ")
}

func TestSendQueueTakeGroupsByQueue(t *testing.T) {
	big := `"` + strings.Repeat("x", sendBatchBytes) + `"`
	abandoned := waitingReq("a", "t", "3")
	abandoned.state.Store(reqAbandoned)
	s := &sendQueue{pending: []*sendReq{
		waitingReq("a", "t", "1"),
		waitingReq("b", "t", "b1"),
		waitingReq("a", "u", "u1"),
		abandoned,
		waitingReq("a", "t", "2"),
		waitingReq("a", "t", big),
		waitingReq("b", "t", "b2"),
	}}
	want := []string{"1 u1 2", "b1 b2", big, ""}
	for i, w := range want {
		got := s.take()
		if names(got) != w {
			t.Fatalf("take %d: got %.40q, want %.40q", i, names(got), w)
		}
		for _, r := range got {
			if r.state.Load() != reqTaken {
				t.Fatalf("take %d: request %.20q not marked taken", i, r.payload)
			}
		}
	}
	if len(s.pending) != 0 {
		t.Fatalf("%d requests left", len(s.pending))
	}
}

func TestSendQueueTakeBounds(t *testing.T) {
	s := &sendQueue{}
	for range sendBatchMax + 10 {
		s.pending = append(s.pending, waitingReq("a", "t", "1"))
	}
	if n := len(s.take()); n != sendBatchMax {
		t.Fatalf("first batch has %d events, want %d", n, sendBatchMax)
	}
	if n := len(s.take()); n != 10 {
		t.Fatalf("second batch has %d events, want 10", n)
	}

	// Payloads of a third of the byte bound each: three fit, the fourth
	// goes into the next statement.
	p := `"` + strings.Repeat("y", sendBatchBytes/3-2) + `"`
	for range 4 {
		s.pending = append(s.pending, waitingReq("a", "t", p))
	}
	if n := len(s.take()); n != 3 {
		t.Fatalf("batch of large payloads has %d events, want 3", n)
	}
	if n := len(s.take()); n != 1 {
		t.Fatalf("next batch has %d events, want 1", n)
	}
}

func TestSendQueueCompactDropsAbandoned(t *testing.T) {
	s := &sendQueue{}
	for i := range 10 {
		r := waitingReq("a", "t", "1")
		if i%3 != 0 {
			r.state.Store(reqAbandoned)
		}
		s.pending = append(s.pending, r)
	}
	s.compact()
	if len(s.pending) != 4 {
		t.Fatalf("%d requests kept, want 4", len(s.pending))
	}
	for _, r := range s.pending {
		if r.state.Load() != reqWaiting {
			t.Fatal("kept an abandoned request")
		}
	}
}

func TestSendQueueRetriesAloneOnlyForEventErrors(t *testing.T) {
	for code, want := range map[string]bool{
		"22P05": true,  // \u0000 in a payload
		"22P02": true,  // not JSON
		"54000": true,  // a value past a limit
		"23505": true,  // a unique violation
		"PQ011": true,  // an invalid argument
		"PQ001": false, // queue not found
		"42501": false, // permission
		"57014": false, // statement timeout
		"55P03": false, // lock not available
		"25006": false, // read-only server
		"08006": false, // connection failure
		"":      false,
	} {
		if got := eventError(code); got != want {
			t.Errorf("eventError(%q) = %v, want %v", code, got, want)
		}
	}
}
