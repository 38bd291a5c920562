package web

import (
	"testing"
	"time"

	"github.com/pgque/pgque/cmd/pgque/internal/view"
)

// TestSummarizeCountsBlockedKeys: the overview's queue backlog and
// consumer lag and head age come from the slots' lag and oldest pending
// age (which count the events blocked keys hold back), and the blocked
// keys are summed beside them per consumer and per queue.
func TestSummarizeCountsBlockedKeys(t *testing.T) {
	smp := sample{Time: time.Now(), Queues: []view.QueueInfo{{Name: "files"}}, Slots: []view.SlotRow{
		{Queue: "files", Consumer: "storage", Slot: 0, NSlots: 2, Lag: 3, OldestPendingSeconds: 40, BlockedKeys: 1},
		{Queue: "files", Consumer: "storage", Slot: 1, NSlots: 2, Lag: 0},
		{Queue: "files", Consumer: "index", Slot: 0, NSlots: 1, Lag: 2, OldestPendingSeconds: 5, BlockedKeys: 2},
	}}
	queues, groups, p := summarize(smp)
	if len(groups) != 2 || groups[0].Lag != 3 || groups[0].HeadAge != 40 || groups[0].BlockedKeys != 1 || groups[1].BlockedKeys != 2 {
		t.Errorf("groups %+v, want storage lag 3, head age 40 s, 1 blocked key and index 2 blocked keys", groups)
	}
	if len(queues) != 1 || queues[0].Backlog != 3 || queues[0].BlockedKeys != 3 {
		t.Errorf("queues %+v, want files with backlog 3 and 3 blocked keys", queues)
	}
	if p.Backlog["files"] != 3 || p.HeadAge["files/storage"] != 40 {
		t.Errorf("chart point %+v", p)
	}
}
