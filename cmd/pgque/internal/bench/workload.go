package bench

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// The workload every suite shares: file-lifecycle events of a multi-tenant
// storage service (the design's motivating user), about 110 bytes of JSON
// each, keyed by tenant.

const (
	// batchSize is the number of events per send_batch / INSERT ... SELECT /
	// batched insert_event call, and per tick when a backlog is built.
	batchSize = 1000
	// tenants is the number of distinct partition keys.
	tenants = 1000
	// eventType is ev_type for every event.
	eventType = "FileCreated"
)

// payload returns the JSON payload of event i.
func payload(i int) string {
	return fmt.Sprintf(`{"tenant":"%s","seq":%d,"path":"/bucket-%d/objects/%08d.bin","size":%d}`,
		tenantKey(i), i, i%tenants, i, 4096+i%8192)
}

// tenantKey returns the partition key of event i.
func tenantKey(i int) string { return "tenant-" + strconv.Itoa(i%tenants) }

// batchPayloads returns the payloads and keys of events from..from+n-1.
func batchPayloads(from, n int) (payloads, keys []string) {
	payloads = make([]string, n)
	keys = make([]string, n)
	for i := range n {
		payloads[i] = payload(from + i)
		keys[i] = tenantKey(from + i)
	}
	return payloads, keys
}

// timedPayload is the payload of the latency suite: it carries the time the
// producer called send, in Unix nanoseconds.
type timedPayload struct {
	Tenant string `json:"tenant"`
	Seq    int    `json:"seq"`
	SentNS int64  `json:"sent_ns"`
}

func newTimedPayload(i int, t time.Time) []byte {
	b, _ := json.Marshal(timedPayload{Tenant: tenantKey(i), Seq: i, SentNS: t.UnixNano()})
	return b
}
