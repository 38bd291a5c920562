package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgque/pgque"
)

// maxLineBytes bounds one JSON line read from stdin.
const maxLineBytes = 64 << 20

func (a *app) sendCommand() *cobra.Command {
	var (
		typ, key string
		dedupKey string
		envelope bool
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "send <queue> [payload]",
		Short: "Send events: one JSON payload argument, or JSON lines on stdin",
		Long: `Send sends one event whose payload is the JSON argument, or, without it, one
event per line of stdin (blank lines are skipped). It prints the event ids,
one per line, in input order.

stdin is read to the end and validated before anything is sent; then every
line is sent in one transaction. So a malformed line anywhere fails the whole
command (the error names the line) and nothing at all is sent: there are no
half-sent inputs.

Each stdin line is at most 64 MiB. --type and --key apply to every event. With --envelope each line is instead
an object {"type": ..., "key": ..., "dedup_key": ..., "payload": ...} whose
type and key override the flags, so one stream can carry many partition keys
("key": null sends the line with no key). As in the Go library, an empty
key is no key: --key "" and "key": "" send the NULL key (slot 0).

--dedup-key (one event only) or the envelope's "dedup_key" makes a send safe
to retry: a key the queue has seen within its dedup_window (default 5
minutes) stores nothing and prints the first event's id again.

  pgque send orders '{"id": 1}' --type OrderPlaced --key customer-7
  jq -c '.[]' events.json | pgque send orders --type Imported
  printf '%s\n' '{"key":"t1","payload":{"n":1}}' | pgque send orders --envelope
  pgque send orders '{"id": 1}' --dedup-key order-1-placed`,
		Args: rangeArgs([]string{"queue"}, "payload"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var events []pgque.Event
			if len(args) == 2 {
				payload := []byte(args[1])
				if err := checkJSON(payload); err != nil {
					return usagef("the payload argument is not valid JSON (%v); to send a string, quote it: '\"text\"'", err)
				}
				events = []pgque.Event{{Type: typ, Payload: json.RawMessage(payload), PartitionKey: key, DedupKey: dedupKey}}
			} else {
				if isTerminal(a.stdin) {
					fmt.Fprintln(a.stderr, "pgque: reading JSON lines from stdin (Ctrl-D to end)")
				}
				var err error
				if events, err = readEvents(a.stdin, typ, key, envelope); err != nil {
					return err
				}
				if dedupKey != "" {
					if len(events) != 1 {
						return usagef("--dedup-key names one event, and stdin had %d; give each envelope line its own \"dedup_key\"", len(events))
					}
					events[0].DedupKey = dedupKey
				}
				if len(events) == 0 {
					return a.printSent(args[0], nil, asJSON)
				}
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			ids, err := s.SendBatch(ctx, args[0], events)
			if err != nil {
				return err
			}
			return a.printSent(args[0], ids, asJSON)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&typ, "type", "t", "", "event type (default \""+pgque.EventTypeDefault+"\")")
	f.StringVarP(&key, "key", "k", "", "partition key: events with the same key are consumed in order (default none: slot 0)")
	f.StringVar(&dedupKey, "dedup-key", "", "idempotency key of the one event sent: a retry within the queue's dedup_window sends nothing")
	f.BoolVar(&envelope, "envelope", false, `stdin lines are {"type", "key", "dedup_key", "payload"} objects`)
	f.BoolVar(&asJSON, "json", false, "print the event ids as JSON")
	return cmd
}

// printSent prints the event ids, one per line or as JSON.
func (a *app) printSent(queue string, ids []int64, asJSON bool) error {
	if asJSON {
		return a.printJSON(map[string]any{"queue": queue, "ev_ids": nonNil(ids)})
	}
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(strconv.FormatInt(id, 10))
		b.WriteByte('\n')
	}
	_, err := io.WriteString(a.stdout, b.String())
	return err
}

// envelopeLine is one --envelope line.
type envelopeLine struct {
	Type     *string         `json:"type"`
	Key      json.RawMessage `json:"key"` // absent: --key; null: no key
	DedupKey *string         `json:"dedup_key"`
	Payload  json.RawMessage `json:"payload"`
}

// readEvents reads every line of r and turns each non-blank one into an
// event; the first malformed line fails the whole input.
func readEvents(r io.Reader, typ, key string, envelope bool) ([]pgque.Event, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	var events []pgque.Event
	n := 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		ev := pgque.Event{Type: typ, PartitionKey: key}
		if envelope {
			var env envelopeLine
			dec := json.NewDecoder(bytes.NewReader(line))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&env); err != nil {
				return nil, lineErr(n, "not an envelope object", err)
			}
			if err := atEOF(dec); err != nil {
				return nil, lineErr(n, "not an envelope object", err)
			}
			if len(env.Payload) == 0 {
				return nil, lineErr(n, "not an envelope object", errors.New(`"payload" is missing`))
			}
			if env.Type != nil {
				ev.Type = *env.Type
			}
			if len(env.Key) > 0 {
				var k *string
				if err := json.Unmarshal(env.Key, &k); err != nil {
					return nil, lineErr(n, "not an envelope object", errors.New(`"key" is neither a string nor null`))
				}
				ev.PartitionKey = ""
				if k != nil {
					ev.PartitionKey = *k
				}
			}
			if env.DedupKey != nil {
				ev.DedupKey = *env.DedupKey
			}
			ev.Payload = env.Payload
		} else {
			if err := checkJSON(line); err != nil {
				return nil, lineErr(n, "invalid JSON", err)
			}
			ev.Payload = json.RawMessage(bytes.Clone(line))
		}
		events = append(events, ev)
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return nil, fmt.Errorf("stdin line %d is longer than %d MiB, the longest line pgque send reads; nothing was sent",
			n+1, maxLineBytes>>20)
	} else if err != nil {
		return nil, fmt.Errorf("reading stdin after %d events: %w; nothing was sent", len(events), err)
	}
	return events, nil
}

// lineErr reports a bad stdin line.
func lineErr(n int, what string, err error) error {
	return fmt.Errorf("stdin line %d: %s: %v; nothing was sent", n, what, err)
}

// checkJSON reports why b is not exactly one JSON value.
func checkJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return err
	}
	return atEOF(dec)
}

// atEOF reports an error unless dec has consumed all its input.
func atEOF(dec *json.Decoder) error {
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}
