package workerpool

import (
	"strconv"
	"strings"
)

// SlotsChannel carries, after a tick, the slots the tick's batch touched
// (pgque._tick_slots): "<tag>:<N>=<hex>[,<N>=<hex>...]" per slot count N
// in use on the queue, or "<tag>:*" for every slot. The ticker's plain tag
// on TickChannel is sent as well, for clients that wake every slot on it.
const SlotsChannel = "pgque_slots"

// touched is one decoded SlotsChannel payload. Anyone may NOTIFY, so it is
// a hint only: a wrong set costs a slot latency until its poll, never an
// event, since batches are fixed by tick snapshots whoever is woken.
type touched struct {
	all  bool
	sets map[int]string // N → hex digits, slot 4j+b = bit 8>>b of digit j
}

// parseTouched decodes payload for the queue tagged tag. ok is false when
// the payload is not the queue's. Anything it cannot read is every slot.
func parseTouched(payload, tag string) (t touched, ok bool) {
	rest, ok := strings.CutPrefix(payload, tag+":")
	if !ok {
		return touched{}, false
	}
	if rest == "*" {
		return touched{all: true}, true
	}
	t.sets = make(map[int]string)
	for part := range strings.SplitSeq(rest, ",") {
		ns, hex, found := strings.Cut(part, "=")
		n, err := strconv.Atoi(ns)
		if !found || err != nil || n < 1 || len(hex) != (n+3)/4 {
			return touched{all: true}, true
		}
		t.sets[n] = hex
	}
	return t, true
}

// has reports whether slot of nslots may have work. A slot count the
// payload does not mention (a resize under way, a set the server skipped)
// counts as touched.
func (t touched) has(nslots, slot int) bool {
	if t.all {
		return true
	}
	hex, ok := t.sets[nslots]
	if !ok || slot < 0 || slot/4 >= len(hex) {
		return true
	}
	d, err := strconv.ParseUint(hex[slot/4:slot/4+1], 16, 8)
	if err != nil {
		return true
	}
	return d&(8>>(slot%4)) != 0
}

// Touches reports whether payload, a notification on SlotsChannel, is for
// the queue tagged tag (ok) and may concern slot of nslots (touched). It
// is the test a client working one slot on its own connection makes.
func Touches(payload, tag string, nslots, slot int) (ok, touched bool) {
	t, ok := parseTouched(payload, tag)
	return ok, ok && t.has(nslots, slot)
}
