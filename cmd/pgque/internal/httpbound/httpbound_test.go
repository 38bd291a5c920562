package httpbound

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// request sends one GET on c and reads its response.
func request(t *testing.T, c net.Conn) {
	t.Helper()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// serve runs Server on a Listener of n connections with idle as its
// IdleTimeout until the test ends, and returns its address.
func serve(t *testing.T, n int, idle time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := Server(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	srv.IdleTimeout = idle
	go func() { _ = srv.Serve(Listener(ln, n)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// TestHeldConnectionsAreBounded: a peer that opens connections, sends one
// request on each and keeps them idle holds at most the listener's limit;
// the next connection is served once one of them closes, and the server
// closes an idle one by itself after IdleTimeout.
func TestHeldConnectionsAreBounded(t *testing.T) {
	addr := serve(t, 3, IdleTimeout)
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		request(t, c)
		held = append(held, c)
	}
	// A fourth connection is connected by the kernel but not accepted:
	// its request gets no answer while the three are held.
	fourth, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fourth.Close() })
	if _, err := io.WriteString(fourth, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = fourth.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := fourth.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the fourth connection was answered while three were held (%v)", err)
	}
	// One held connection closes: the fourth is served.
	held[0].Close()
	_ = fourth.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(fourth), nil)
	if err != nil {
		t.Fatalf("the fourth connection after one closed: %v", err)
	}
	resp.Body.Close()

	// An idle connection is closed by the server after IdleTimeout.
	idle := serve(t, 1, 100*time.Millisecond)
	c, err := net.Dial("tcp", idle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	request(t, c)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("an idle connection was not closed by the server: %v", err)
	}
}

// TestLoopbackOnly: a server on a loopback address answers loopback Host
// names only (a page that rebinds its own name to 127.0.0.1 gets 421);
// elsewhere every Host is answered.
func TestLoopbackOnly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := Server(LoopbackOnly(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	for host, want := range map[string]int{"evil.example": 421, "evil.example:9188": 421, "10.0.0.1:9188": 421,
		"localhost": 200, "LOCALHOST:9188": 200, "127.0.0.1:9188": 200, "127.0.0.2": 200, "[::1]:9188": 200} {
		req, err := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %s: %d, want %d", host, resp.StatusCode, want)
		}
	}
	// On every interface the handler is served as it is, to any Host.
	other := &fakeListener{addr: &net.TCPAddr{IP: net.IPv4zero, Port: 9188}}
	h := http.Handler(&http.ServeMux{})
	if LoopbackOnly(other, h) != h {
		t.Fatal("a server on every interface got a Host check")
	}
}

// fakeListener is a listener with only an address.
type fakeListener struct {
	net.Listener
	addr net.Addr
}

func (f *fakeListener) Addr() net.Addr { return f.addr }
