package relay

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Defaults for Config.
const (
	// TimeoutDefault bounds one request: connecting, sending, and reading
	// the response.
	TimeoutDefault = 30 * time.Second
	// MaxInFlightDefault caps the requests one relay process has in flight
	// (and, unless --concurrency says otherwise, the keys it works at once).
	// With handlers that take tens of milliseconds of I/O, the rate is about
	// this many requests per handler time: 256 at 20 ms is 12 800 ev/s at
	// most, what one relay process on a small machine delivers (about 8 500
	// measured); an endpoint that cannot take that many at once sets it
	// lower.
	MaxInFlightDefault = 256
	// RetryAfterMaxDefault clamps a response's Retry-After.
	RetryAfterMaxDefault = 10 * time.Minute
	// UnreachableBackoffMinDefault and UnreachableBackoffMaxDefault bound
	// the wait between two attempts at an endpoint that cannot be reached.
	UnreachableBackoffMinDefault = 100 * time.Millisecond
	UnreachableBackoffMaxDefault = 30 * time.Second
	// DeadLetterStatus is the status with which an endpoint rejects an
	// event for good.
	DeadLetterStatus = http.StatusUnprocessableEntity
	// AuthHeaderDefault is the header that carries Config.AuthValue.
	AuthHeaderDefault = "Authorization"
)

// Config configures a Relay.
type Config struct {
	// URL is the endpoint every event is POSTed to: http or https.
	// Required.
	URL string
	// Queue and Consumer name the subscription; they make ce-source and
	// ce-id. Required.
	Queue, Consumer string
	// Timeout bounds one request. Default TimeoutDefault.
	Timeout time.Duration
	// MaxInFlight caps concurrent requests of this process. Default
	// MaxInFlightDefault.
	MaxInFlight int
	// CAFile is a PEM file of CA certificates trusted for an https
	// endpoint, instead of the system pool.
	CAFile string
	// InsecureSkipVerify turns off TLS certificate verification. For tests
	// only: anyone on the path can then read and forge the traffic.
	InsecureSkipVerify bool
	// AuthHeader names the header that carries AuthValue. Default
	// AuthHeaderDefault.
	AuthHeader string
	// AuthValue, when set, is sent as AuthHeader on every request. It is
	// never logged.
	AuthValue string
	// RetryAfterMax clamps a response's Retry-After. Default
	// RetryAfterMaxDefault.
	RetryAfterMax time.Duration
	// UnreachableBackoffMin and UnreachableBackoffMax bound the wait
	// between attempts at an unreachable endpoint. Defaults
	// UnreachableBackoffMinDefault, UnreachableBackoffMaxDefault.
	UnreachableBackoffMin, UnreachableBackoffMax time.Duration
	// Logger receives the relay's logs. Default slog.Default().
	Logger *slog.Logger
	// Metrics receives the relay's measurements. Default: unregistered
	// collectors.
	Metrics *Metrics
}

func (c *Config) withDefaults() Config {
	out := *c
	if out.Timeout == 0 {
		out.Timeout = TimeoutDefault
	}
	if out.MaxInFlight == 0 {
		out.MaxInFlight = MaxInFlightDefault
	}
	if out.RetryAfterMax == 0 {
		out.RetryAfterMax = RetryAfterMaxDefault
	}
	if out.UnreachableBackoffMin == 0 {
		out.UnreachableBackoffMin = UnreachableBackoffMinDefault
	}
	if out.UnreachableBackoffMax == 0 {
		out.UnreachableBackoffMax = UnreachableBackoffMaxDefault
	}
	if out.AuthHeader == "" {
		out.AuthHeader = AuthHeaderDefault
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.Metrics == nil {
		out.Metrics = NewMetrics(nil)
	}
	return out
}

// ErrInvalidConfig is wrapped by every Config validation error.
var ErrInvalidConfig = errors.New("relay: invalid config")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

func (c *Config) validate() (*url.URL, error) {
	if c.URL == "" {
		return nil, invalid("the endpoint URL is empty")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, invalid("endpoint URL %q: %v", c.URL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, invalid("endpoint URL %q: scheme %q is not http or https", c.URL, u.Scheme)
	}
	if u.Host == "" {
		return nil, invalid("endpoint URL %q has no host", c.URL)
	}
	if u.User != nil {
		return nil, invalid("endpoint URL must not carry credentials; use the auth header from the environment")
	}
	switch {
	case c.Queue == "" || c.Consumer == "":
		return nil, invalid("queue and consumer are required")
	case c.Timeout < 0:
		return nil, invalid("timeout %v is negative", c.Timeout)
	case c.MaxInFlight < 0:
		return nil, invalid("max in flight %d is negative", c.MaxInFlight)
	case c.RetryAfterMax < 0 || c.UnreachableBackoffMin < 0 || c.UnreachableBackoffMax < 0:
		return nil, invalid("backoff bounds must not be negative")
	case c.UnreachableBackoffMax != 0 && c.UnreachableBackoffMin > c.UnreachableBackoffMax:
		return nil, invalid("unreachable backoff min %v is above max %v", c.UnreachableBackoffMin, c.UnreachableBackoffMax)
	case c.AuthHeader != "" && !validHeaderName(c.AuthHeader):
		return nil, invalid("auth header name %q is not a valid HTTP header name", c.AuthHeader)
	case c.AuthHeader != "" && reservedHeader(c.AuthHeader):
		return nil, invalid("auth header name %q is one the relay or HTTP itself sets (Host, Content-*, ce-*, pgque-*, ...): the secret would not be sent as given", c.AuthHeader)
	case c.AuthValue != "" && !validHeaderValue(c.AuthValue):
		// The value itself is never echoed.
		return nil, invalid("the auth header value contains a control character")
	}
	return u, nil
}

// httpClient builds the client: a transport tuned for many short requests
// to one host, keeping up to MaxInFlight connections alive, and never
// following redirects (a redirect is reported as the endpoint's answer).
func (c *Config) httpClient(u *url.URL) (*http.Client, error) {
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.InsecureSkipVerify} //nolint:gosec // opt-in, warned about
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, invalid("reading CA file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, invalid("CA file %q holds no PEM certificate", c.CAFile)
		}
		tlsConfig.RootCAs = pool
	}
	dialer := &net.Dialer{Timeout: min(c.Timeout, 10*time.Second), KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         dialer.DialContext,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: min(c.Timeout, 10*time.Second),
		ForceAttemptHTTP2:   u.Scheme == "https",
		MaxIdleConns:        c.MaxInFlight,
		MaxIdleConnsPerHost: c.MaxInFlight,
		MaxConnsPerHost:     c.MaxInFlight,
		// Below Node.js's default keepAliveTimeout (5 s), so that the relay
		// drops an idle connection before the server does and rarely sends
		// on one the server is closing.
		IdleConnTimeout:       4 * time.Second,
		ExpectContinueTimeout: time.Second,
		// The payload is JSON the application reads: compressing responses
		// buys nothing, and a transparent gzip would hide the body size.
		DisableCompression: true,
	}
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}, nil
}

// validHeaderName reports whether s is an RFC 9110 token.
// reservedHeader reports whether name is a header the request sets itself:
// HTTP's framing and routing, and every header the relay writes.
func reservedHeader(name string) bool {
	n := strings.ToLower(name)
	switch n {
	case "host", "content-length", "content-type", "transfer-encoding", "connection", "te", "trailer",
		"upgrade", "expect", "keep-alive", "proxy-connection", "idempotency-key":
		return true
	}
	return strings.HasPrefix(n, "ce-") || strings.HasPrefix(n, "pgque-")
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch >= '0' && ch <= '9' || ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' {
			continue
		}
		switch ch {
		case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
			continue
		}
		return false
	}
	return true
}

// validHeaderValue rejects control characters other than tab.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if ch := s[i]; ch < ' ' && ch != '\t' || ch == 0x7f {
			return false
		}
	}
	return true
}

func parseURL(s string) (*url.URL, error) { return url.Parse(s) }
