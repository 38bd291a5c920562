package web

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/pgque/pgque"
)

// Defaults of Config.
const (
	// SampleIntervalDefault is how often the charts' history is sampled.
	SampleIntervalDefault = 2 * time.Second
	// HistoryLength is how many samples the charts keep (10 minutes at the
	// default interval).
	HistoryLength = 300
	// ConsoleKeyScan bounds the events one refresh of the keys page reads
	// (per view), the library's default: the page refreshes every five
	// seconds. The heads found are the oldest either way.
	ConsoleKeyScan = pgque.KeyScanDefault
	// TokenHeader carries the token.
	TokenHeader = "X-Pgque-Token"
	// TokenParam hands a browser tab the token: the page's script reads it
	// from the address (/#token=<token>, or ?token=<token>), keeps it in the
	// tab's session storage and sends it in TokenHeader; the server never
	// sets a cookie. A cookie is not bound to a port: the browser sent it to
	// every other server on the console's host, so any local user listening
	// on a loopback port got the token once the operator's browser visited
	// that port. Session storage belongs to the origin, port included.
	TokenParam = "token"
	// MinTokenLength is the shortest token the console accepts.
	MinTokenLength = 16
)

// ContentSecurityPolicy is sent with every response: nothing but the
// console's own scripts, styles and API, no inline code, no framing.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

//go:embed static
var staticFiles embed.FS

// Config configures a Server.
type Config struct {
	// Client reaches the database; it is required.
	Client *pgque.Client
	// Logger is required.
	Logger *slog.Logger
	// AllowActions enables the POST actions; Token must then be set.
	AllowActions bool
	// Token is the secret of actions and, with RequireToken, of every
	// API request: at least MinTokenLength characters.
	Token string
	// RequireToken refuses every API request (every read of the database)
	// that does not carry the token in TokenHeader. The page and its
	// static files hold no data and are served without it, so that the
	// page's script can read the token from the address (TokenParam).
	// pgque web always sets it: beyond loopback any page a browser on the
	// network loads could otherwise read the console by DNS rebinding,
	// and on loopback any local user could.
	RequireToken bool
	// AllowedHosts lists the Host header values (without port) the console
	// answers to, against DNS rebinding; empty answers to any.
	AllowedHosts []string
	// SampleInterval is the charts' sampling period; 0 means
	// SampleIntervalDefault.
	SampleInterval time.Duration
}

// Server is the console: an http.Handler and the history sampler.
type Server struct {
	cfg    Config
	mux    *http.ServeMux
	static http.Handler

	mu      sync.Mutex
	history []sample
}

// New validates cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Client == nil || cfg.Logger == nil:
		return nil, errors.New("web: Config.Client and Logger are required")
	case cfg.AllowActions && len(cfg.Token) < MinTokenLength:
		return nil, fmt.Errorf("web: actions need a token of at least %d characters", MinTokenLength)
	case cfg.RequireToken && len(cfg.Token) < MinTokenLength:
		return nil, fmt.Errorf("web: a console that requires its token needs one of at least %d characters", MinTokenLength)
	case cfg.SampleInterval < 0:
		return nil, errors.New("web: Config.SampleInterval is negative")
	}
	if cfg.SampleInterval == 0 {
		cfg.SampleInterval = SampleIntervalDefault
	}
	sub, err := fs.Sub(staticFiles, "static")
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), static: http.FileServerFS(sub)}
	for _, page := range []string{"/{$}", "/consumers", "/keys", "/dlq"} {
		s.mux.HandleFunc("GET "+page, s.page)
	}
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", s.static))
	s.mux.HandleFunc("GET /api/overview", s.apiOverview)
	s.mux.HandleFunc("GET /api/keys", s.apiKeys)
	s.mux.HandleFunc("GET /api/dlq", s.apiDeadLetters)
	s.mux.HandleFunc("POST /api/actions/{action}", s.apiAction)
	return s, nil
}

// ServeHTTP sets the security headers, refuses unknown hosts, and routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if !s.hostAllowed(r.Host) {
		writeError(w, http.StatusMisdirectedRequest, "this console does not answer to host "+r.Host)
		return
	}
	if s.cfg.RequireToken && strings.HasPrefix(r.URL.Path, "/api/") && !s.tokenMatches(r.Header.Get(TokenHeader)) {
		writeError(w, http.StatusUnauthorized, "this console requires its token: open /#"+TokenParam+
			"=<token> once in the browser tab, or send the "+TokenHeader+" header")
		return
	}
	s.mux.ServeHTTP(w, r)
}

// tokenMatches compares got with the token in constant time.
func (s *Server) tokenMatches(got string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.Token)) == 1
}

// hostAllowed checks the Host header against AllowedHosts.
func (s *Server) hostAllowed(hostport string) bool {
	if len(s.cfg.AllowedHosts) == 0 {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	for _, a := range s.cfg.AllowedHosts {
		if strings.EqualFold(a, host) {
			return true
		}
	}
	return false
}

// page serves the console's single HTML document for every page path; the
// script picks the page from the path.
func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	body, err := staticFiles.ReadFile("static/index.html")
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(body)
}

// checkAction enforces, for a POST action: actions enabled, a JSON body,
// the console's own origin, and the token. It writes the refusal and
// returns false when one fails.
func (s *Server) checkAction(w http.ResponseWriter, r *http.Request) bool {
	if !s.cfg.AllowActions {
		writeError(w, http.StatusForbidden, "actions are disabled: start pgque web with --allow-actions")
		return false
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		writeError(w, http.StatusUnsupportedMediaType, "actions take a JSON body (Content-Type: application/json)")
		return false
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		writeError(w, http.StatusForbidden, "cross-site request refused")
		return false
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			writeError(w, http.StatusForbidden, "request from another origin refused")
			return false
		}
	}
	if !s.tokenMatches(r.Header.Get(TokenHeader)) {
		writeError(w, http.StatusUnauthorized, "missing or wrong action token ("+TokenHeader+" header)")
		return false
	}
	return true
}

// writeJSON writes v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes {"error": msg}.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// Run samples the charts' history until ctx ends. The interval stretches to
// ten times the last read's duration, so that a slow partition_slot_status
// on a large backlog never keeps the database busy more than a tenth of the
// time.
func (s *Server) Run(ctx context.Context) {
	for {
		start := time.Now()
		if smp, err := s.sample(ctx); err == nil {
			s.mu.Lock()
			s.history = append(s.history, smp)
			if len(s.history) > HistoryLength {
				s.history = s.history[len(s.history)-HistoryLength:]
			}
			s.mu.Unlock()
		} else if ctx.Err() == nil {
			s.cfg.Logger.WarnContext(ctx, "pgque web: sampling", slog.Any("error", err))
		}
		wait := max(s.cfg.SampleInterval, 10*time.Since(start))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
