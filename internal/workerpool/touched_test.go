package workerpool

import "testing"

// The payload pgque._tick_slots sends (its SQL side is checked against a
// server in internal/sqltest/partitiontest, TestTickNotifiesTouchedSlots):
// the bits decode to the slots named, and anything unreadable or unnamed
// wakes the slot rather than leaving it asleep.
func TestParseTouched(t *testing.T) {
	const tag = "6c00d327600d1618"
	type probe struct {
		nslots, slot int
		want         bool
	}
	for _, c := range []struct {
		payload string
		ok      bool
		probes  []probe
	}{
		{tag + ":16=2248", true, []probe{{16, 2, true}, {16, 6, true}, {16, 9, true}, {16, 12, true},
			{16, 0, false}, {16, 5, false}, {16, 15, false}, {4, 1, true}, {16, 16, true}}},
		{tag + ":4=8,16=0001", true, []probe{{4, 0, true}, {4, 1, false}, {16, 15, true}, {16, 14, false}}},
		{tag + ":3=4", true, []probe{{3, 1, true}, {3, 0, false}, {3, 2, false}}},
		{tag + ":*", true, []probe{{16, 7, true}, {1024, 1000, true}}},
		{tag + ":16=22", true, []probe{{16, 3, true}}},   // wrong length: every slot
		{tag + ":16=zz48", true, []probe{{16, 3, true}}}, // not hex: every slot
		{tag + ":x", true, []probe{{16, 3, true}}},
		{"0000000000000000:16=2248", false, nil},
		{tag, false, nil},
	} {
		got, ok := parseTouched(c.payload, tag)
		if other, _ := Touches(c.payload, tag, 16, 0); other != ok {
			t.Errorf("Touches(%q) ok = %v, parseTouched says %v", c.payload, other, ok)
		}
		if ok != c.ok {
			t.Errorf("parseTouched(%q) ok = %v, want %v", c.payload, ok, c.ok)
			continue
		}
		for _, p := range c.probes {
			if h := got.has(p.nslots, p.slot); h != p.want {
				t.Errorf("parseTouched(%q).has(%d, %d) = %v, want %v", c.payload, p.nslots, p.slot, h, p.want)
			}
			if ok, h := Touches(c.payload, tag, p.nslots, p.slot); !ok || h != p.want {
				t.Errorf("Touches(%q, %d, %d) = %v, %v, want true, %v", c.payload, p.nslots, p.slot, ok, h, p.want)
			}
		}
	}
}
