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
func EncodeKey(key string) string { return percentEncode(key, keySafe) }

// EncodeAttr percent-encodes a CloudEvents attribute for its ce-* header,
// as the CloudEvents HTTP binding asks: space, '"', '%' and every byte
// outside printable ASCII become %XX of its UTF-8 byte; everything else is
// sent as it is, so an ordinary type such as "file.created" is unchanged.
// No event value can then break the header apart (a CR/LF in an event's
// type once made the request impossible to build).
func EncodeAttr(v string) string { return percentEncode(v, attrSafe) }

// keySafe reports whether EncodeKey sends byte ch as it is.
func keySafe(ch byte) bool {
	return ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '.' || ch == '_' || ch == '~'
}

// attrSafe reports whether EncodeAttr sends byte ch as it is.
func attrSafe(ch byte) bool {
	return ch > ' ' && ch < 0x7f && ch != '"' && ch != '%'
}

// percentEncode writes every byte of v that safe refuses as %XX.
func percentEncode(v string, safe func(byte) bool) string {
	var b strings.Builder
	b.Grow(len(v))
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		ch := v[i]
		if safe(ch) {
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
