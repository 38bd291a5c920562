package dbq

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// chunkShape says which columns a chunk's rows have past the seven every
// receive returns.
type chunkShape int

const (
	plainRows chunkShape = iota // msg_id … partition_key
	epochRows                   // and the lease epoch
	slotRows                    // and the lease epoch, the slot and its N (receive_partitioned_raw_slots)
)

// readChunk reads a chunk's rows: msg_id, batch_id, type, payload,
// retry_count, created_at, partition_key and what shape adds.
// jsonPayload makes a stored payload the JSON the caller promises (nil
// stands for SQL NULL). A NULL type (insert_event can store one) is the
// empty type: a row the client cannot read would stop its consumer for
// good, since the same chunk comes back until it is acknowledged.
//
// A chunk is up to 100 000 rows and every consumer reads every event
// through here, so the common case skips pgx's per-value scan plans: when
// the server sent the columns with the types above, the numbers and the
// time in the binary format (the extended protocol, which pgx uses unless
// told otherwise), the
// values are decoded in place, the payloads of a chunk share one
// allocation and a type repeated from the row before shares its string.
// Any other shape (the simple protocol's text format, say) is scanned the
// ordinary way.
func readChunk(rows pgx.Rows, shape chunkShape, jsonPayload func([]byte) []byte) ([]Row, error) {
	defer rows.Close()
	if !binaryChunk(rows.FieldDescriptions(), shape) {
		return scanChunk(rows, shape, jsonPayload)
	}
	// aux[i] is what row i gets once every row is read (out and arena
	// move while they grow): its payload's span in arena ({-1, 0} when it
	// has its own copy, {-1, -1} for NULL) and its key.
	type rowAux struct {
		span  [2]int
		key   string
		keyed bool
	}
	var (
		out   []Row
		aux   []rowAux
		arena []byte // the small payloads, back to back
	)
	for rows.Next() {
		v := rows.RawValues()
		var r Row
		var err error
		if r.MsgID, err = int8Value(v[0], "msg_id"); err != nil {
			return nil, err
		}
		if r.BatchID, err = int8Value(v[1], "batch_id"); err != nil {
			return nil, err
		}
		switch {
		case v[2] == nil:
		case len(out) > 0 && out[len(out)-1].Type == string(v[2]):
			r.Type = out[len(out)-1].Type
		default:
			r.Type = string(v[2])
		}
		var a rowAux
		switch p := v[3]; {
		case p == nil:
			a.span = [2]int{-1, -1}
		case len(p) > arenaMaxPayload:
			a.span = [2]int{-1, 0}
			r.Payload = append([]byte(nil), p...)
		default:
			a.span = [2]int{len(arena), len(arena) + len(p)}
			arena = append(arena, p...)
		}
		if v[4] != nil {
			if r.RetryCount, err = int4Value(v[4], "retry_count"); err != nil {
				return nil, err
			}
			r.readReplay()
		}
		if r.CreatedAt, err = timestamptzValue(v[5]); err != nil {
			return nil, err
		}
		if k := v[6]; k != nil {
			a.keyed = true
			// A key repeated from the row before (a busy tenant's run)
			// shares its string.
			if n := len(aux); n > 0 && aux[n-1].keyed && aux[n-1].key == string(k) {
				a.key = aux[n-1].key
			} else {
				a.key = string(k)
			}
		}
		aux = append(aux, a)
		if shape >= epochRows {
			if r.Epoch, err = int8Value(v[7], "epoch"); err != nil {
				return nil, err
			}
		}
		if shape == slotRows {
			if r.Slot, err = int4Value(v[8], "slot"); err != nil {
				return nil, err
			}
			if r.NSlots, err = int4Value(v[9], "nslots"); err != nil {
				return nil, err
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range out {
		if aux[i].keyed {
			out[i].PartitionKey = &aux[i].key
		}
		switch s := aux[i].span; {
		case s[0] >= 0:
			out[i].Payload = jsonPayload(arena[s[0]:s[1]:s[1]])
		case s[1] == 0:
			out[i].Payload = jsonPayload(out[i].Payload)
		default:
			out[i].Payload = jsonPayload(nil)
		}
	}
	return out, nil
}

// arenaMaxPayload is the largest payload that shares its chunk's
// allocation; a larger one gets its own, so that a handler keeping one
// large payload does not keep the whole chunk's.
const arenaMaxPayload = 16 << 10

// binaryChunk reports whether the rows have the columns readChunk decodes
// in place, every one but the text ones in the binary format.
func binaryChunk(fds []pgconn.FieldDescription, shape chunkShape) bool {
	want := []uint32{pgtype.Int8OID, pgtype.Int8OID, pgtype.TextOID, pgtype.TextOID, pgtype.Int4OID, pgtype.TimestamptzOID, pgtype.TextOID}
	if shape >= epochRows {
		want = append(want, pgtype.Int8OID)
	}
	if shape == slotRows {
		want = append(want, pgtype.Int4OID, pgtype.Int4OID)
	}
	if len(fds) != len(want) {
		return false
	}
	for i, fd := range fds {
		// text is the same bytes in either format.
		if fd.DataTypeOID != want[i] || (fd.Format != pgtype.BinaryFormatCode && fd.DataTypeOID != pgtype.TextOID) {
			return false
		}
	}
	return true
}

// scanChunk is readChunk for any other shape of the rows.
func scanChunk(rows pgx.Rows, shape chunkShape, jsonPayload func([]byte) []byte) ([]Row, error) {
	var out []Row
	for rows.Next() {
		var r Row
		var typ *string
		var payload []byte
		dest := []any{&r.MsgID, &r.BatchID, &typ, &payload, &r.RetryCount, &r.CreatedAt, &r.PartitionKey}
		if shape >= epochRows {
			dest = append(dest, &r.Epoch)
		}
		if shape == slotRows {
			dest = append(dest, &r.Slot, &r.NSlots)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if typ != nil {
			r.Type = *typ
		}
		r.readReplay()
		r.Payload = jsonPayload(payload)
		out = append(out, r)
	}
	return out, rows.Err()
}

// readReplay reads the replay mark: a replayed dead letter comes with
// retry_count -1 - n, n its retry count (pgque.dlq_replay_report).
func (r *Row) readReplay() {
	if r.RetryCount < 0 {
		r.Replay, r.RetryCount = true, -1-r.RetryCount
	}
}

func int4Value(b []byte, name string) (int, error) {
	if len(b) != 4 {
		return 0, fmt.Errorf("%s: %d bytes for an int4", name, len(b))
	}
	return int(int32(binary.BigEndian.Uint32(b))), nil
}

func int8Value(b []byte, name string) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%s: %d bytes for an int8", name, len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// timestamptzValue decodes a binary timestamptz as pgx does: microseconds
// since 2000-01-01 UTC, in the local time zone. The infinities, which no
// event's created_at can be, are refused as pgx refuses them for a
// time.Time.
func timestamptzValue(b []byte) (time.Time, error) {
	if len(b) != 8 {
		return time.Time{}, fmt.Errorf("created_at: %d bytes for a timestamptz", len(b))
	}
	us := int64(binary.BigEndian.Uint64(b))
	if us == infinityMicros || us == -infinityMicros-1 {
		return time.Time{}, fmt.Errorf("created_at: an infinite timestamptz")
	}
	const y2kUnixMicros = 946684800000000
	us += y2kUnixMicros
	return time.Unix(us/1000000, us%1000000*1000), nil
}

// infinityMicros is the binary timestamptz 'infinity' (math.MaxInt64);
// '-infinity' is math.MinInt64.
const infinityMicros = 1<<63 - 1
