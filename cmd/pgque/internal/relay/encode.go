package relay

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// EncodeKey percent-encodes a partition key for the pgque-partition-key
// header: every byte other than an ASCII letter, digit, '-', '.', '_' or
// '~' becomes %XX of its UTF-8 byte, so any key (non-ASCII, control
// characters, '%' itself) travels safely and decodeURIComponent in
// JavaScript returns it unchanged.
func EncodeKey(key string) string {
	var b strings.Builder
	b.Grow(len(key))
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(key); i++ {
		ch := key[i]
		if ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '.' || ch == '_' || ch == '~' {
			b.WriteByte(ch)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[ch>>4])
		b.WriteByte(hex[ch&15])
	}
	return b.String()
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP
// date (relative to now; a past date is 0).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		// Clamp before converting: a huge value must not overflow.
		const maxSecs = int64(1<<63-1) / int64(time.Second)
		return time.Duration(min(secs, maxSecs)) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
