// Package httpbound bounds what a peer can hold of pgque's own HTTP
// servers (the web console, the relay's metrics and health port) before
// it proves anything: every connection is closed after a while idle, slow
// reads and writes end, and at most MaxConns connections are open at once;
// a server on a loopback address answers only loopback Host names.
//
// Both servers answered with ReadHeaderTimeout alone. A peer that sent one
// request on each of many connections, even one answered 401, then kept
// them idle, held them forever: 500 such connections used up a relay's
// file descriptors, so it could no longer reach its endpoint and stopped
// delivering. Now a peer holds at most MaxConns connections (more wait in
// the kernel's backlog), for IdleTimeout between requests.
package httpbound

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

const (
	// MaxConns is how many connections a server keeps open at once.
	MaxConns = 64
	// IdleTimeout closes a keep-alive connection that sends no request.
	IdleTimeout = 30 * time.Second
	// ReadTimeout bounds reading a request, headers and body.
	ReadTimeout = 30 * time.Second
	// WriteTimeout bounds writing a response (a console page of dead
	// letters included).
	WriteTimeout = 60 * time.Second
	// MaxHeaderBytes bounds a request's headers.
	MaxHeaderBytes = 64 << 10
)

// Server returns an http.Server for h with the timeouts above.
func Server(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}

// Listener returns ln accepting at most n connections at once: Accept
// waits while n are open, until one closes or ln is closed.
func Listener(ln net.Listener, n int) net.Listener {
	return &limited{Listener: ln, slots: make(chan struct{}, n), closed: make(chan struct{})}
}

type limited struct {
	net.Listener
	slots     chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *limited) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &conn{Conn: c, release: sync.OnceFunc(func() { <-l.slots })}, nil
}

func (l *limited) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// conn gives its listener's place back when closed, once.
type conn struct {
	net.Conn
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// LoopbackOnly wraps h for a server listening on ln: when ln's address is
// a loopback one, a request whose Host is not a loopback name (localhost,
// 127.0.0.1, ::1, …) gets 421, so that a web page whose name its owner
// rebinds to 127.0.0.1 cannot read the server from the operator's
// browser. On any other address every Host is answered.
func LoopbackOnly(ln net.Listener, h http.Handler) http.Handler {
	if a, ok := ln.Addr().(*net.TCPAddr); !ok || !a.IP.IsLoopback() {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.Trim(host, "[]")
		if ip := net.ParseIP(host); !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
			http.Error(w, "this server answers only to loopback host names, not "+r.Host, http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}
