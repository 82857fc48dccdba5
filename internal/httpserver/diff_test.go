package httpserver

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The differential test feeds the same request bytes to this server and
// to net/http's, each over a new Unix-socket connection (the client
// half-closes after writing, so both see the same end of input), with a
// handler that records every call, and compares:
//
//   - the handler calls, in order: method, request-target, protocol, Host,
//     header fields, Content-Length, Transfer-Encoding, Close, the body
//     bytes and the body's read error, and the trailer;
//   - the responses, in order: status code for every one; for the
//     handler's answers also the protocol, Connection: close, framing
//     (Content-Length or chunked), Content-Type, the field the handler set
//     from the query, and the body;
//   - whether the response stream parses.
//
// The handler's behaviour depends on the request path, so that the fuzzer
// reaches the server's paths: "noread" leaves the body unread, "close"
// closes it unread, "partial" reads 3 bytes, "flush" flushes a first byte
// before reading the body, "big" writes 5000 bytes, "status" answers the
// query's s, and h/v set a response field (v may hold CR, LF or NUL).
//
// Known, accepted differences (none changes which requests the handler
// sees, or what it sees of them, on a connection whose client keeps to
// the protocol):
//
//  1. A handler's "Connection" field: net/http keeps the connection unless
//     the first value is exactly "close"; this server closes it when any
//     value lists the close token (the safer reading). diffHandler never
//     sets it (framingField).
//  2. The server's own error answers (400, 417, 431, 501, 505) differ in
//     their text and framing (net/http ends some by the close, this
//     server sends a Content-Length): only the status code is compared.
//  3. Content-Type sniffing: net/http guesses a Content-Type for an answer
//     without one; this server sends none. diffHandler always sets one.
//  4. A request of ambiguous framing (Transfer-Encoding beside
//     Content-Length, or on HTTP/1.0): this server closes the connection
//     after its answer, as RFC 9112 §6.1 and §6.3 require; net/http reads
//     on, and serves what follows as further requests (the bytes an
//     intermediary may have read as the body: smuggling). The handler
//     sees the request as with net/http (acceptAmbiguousClose).
//
// Not compared, because this server does not have them (see Server):
// Hijack (upgrades, CONNECT tunnels), response trailers,
// ResponseController's EnableFullDuplex and deadlines, WriteTimeout, the
// ConnState and ConnContext hooks, http.ServerContextKey in the request's
// context. During Shutdown, a request already buffered is served with
// Connection: close (net/http closes without serving it).
//
// Like net/http, each server reads the rest of the request body before
// the response head (net/http since 2011, issue 15527), so a handler that
// reads after its first Flush (path "flush") reads nothing more, in both.

// diffRecorder is the handler of a differential run: it records each call
// and answers according to the path.
type diffRecorder struct {
	mu    sync.Mutex
	calls []diffCall
}

// diffCall is what the handler saw of a request.
type diffCall struct {
	Method, RequestURI, Proto, Host string
	Header                          http.Header
	ContentLength                   int64
	TransferEncoding                []string
	Close                           bool
	Body                            string
	BodyErr                         string
	Trailer                         http.Header
}

func (d *diffRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	call := diffCall{Method: r.Method, RequestURI: r.RequestURI, Proto: r.Proto, Host: r.Host, Header: r.Header.Clone(),
		ContentLength: r.ContentLength, TransferEncoding: r.TransferEncoding, Close: r.Close}
	path := r.URL.Path
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Handler", "1")
	q := r.URL.Query()
	if h := q.Get("h"); h != "" && !framingField(h) {
		w.Header()[h] = []string{q.Get("v")}
	}
	var body []byte
	var err error
	switch {
	case strings.Contains(path, "noread"):
	case strings.Contains(path, "close"):
		err = r.Body.Close()
	case strings.Contains(path, "partial"):
		body, err = io.ReadAll(io.LimitReader(r.Body, 3))
	case strings.Contains(path, "flush"):
		_, _ = io.WriteString(w, "f")
		w.(http.Flusher).Flush()
		body, err = io.ReadAll(r.Body)
	default:
		body, err = io.ReadAll(r.Body)
	}
	call.Body = string(body)
	if err != nil {
		call.BodyErr = err.Error()
	}
	if len(r.Trailer) > 0 {
		call.Trailer = r.Trailer.Clone()
	}
	d.mu.Lock()
	d.calls = append(d.calls, call)
	d.mu.Unlock()
	if s, err := strconv.Atoi(q.Get("s")); err == nil && s >= 200 && s <= 599 {
		w.WriteHeader(s)
	}
	if strings.Contains(path, "big") {
		_, _ = io.WriteString(w, strings.Repeat("b", 5000))
		return
	}
	_, _ = io.WriteString(w, "ok "+r.Method+" "+path)
}

// framingField reports whether a response field is one the servers own
// or treat differently (accepted difference 1).
func framingField(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Connection", "Content-Length", "Transfer-Encoding", "Trailer", "Content-Type", "X-Handler", "Date":
		return true
	}
	return false
}

func (d *diffRecorder) take() []diffCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.calls
	d.calls = nil
	return c
}

// diffServer is one of the two servers of a differential run.
type diffServer struct {
	name          string
	network, addr string
	rec           *diffRecorder
}

// diffMaxHeaderBytes is both servers' head limit in the differential
// runs: small, so that the fuzzer reaches 431 with short inputs.
const diffMaxHeaderBytes = 2048

// startDiffServers starts this server and net/http's on Unix sockets,
// with a head limit of diffMaxHeaderBytes.
func startDiffServers(tb testing.TB) (lean, std *diffServer) {
	tb.Helper()
	dir, err := os.MkdirTemp("", "hsdiff")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return startBoth(tb, "unix", func(name string) string { return filepath.Join(dir, name) }, diffMaxHeaderBytes)
}

// startBoth starts this server and net/http's (head limit maxHeader, 0 for
// the default) on listeners of network at the addresses addr gives.
func startBoth(tb testing.TB, network string, addr func(name string) string, maxHeader int) (lean, std *diffServer) {
	tb.Helper()
	mk := func(name string) (*diffServer, net.Listener) {
		ln, err := net.Listen(network, addr(name))
		if err != nil {
			tb.Fatal(err)
		}
		return &diffServer{name: name, network: network, addr: ln.Addr().String(), rec: &diffRecorder{}}, ln
	}
	lean, lnL := mk("lean")
	ls, err := New(lean.rec, Options{MaxHeaderBytes: maxHeader, Logger: quietLogger(), DisconnectCheckDelay: time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = ls.Serve(lnL) }()
	std, lnS := mk("std")
	hs := &http.Server{Handler: std.rec, MaxHeaderBytes: maxHeader, ErrorLog: newDiscardLog()}
	go func() { _ = hs.Serve(lnS) }()
	tb.Cleanup(func() {
		_ = ls.Close()
		_ = hs.Close()
	})
	return lean, std
}

// diffResp is what the client saw of one response.
type diffResp struct {
	Status  int
	Handler bool // the handler's answer (else the server's)
	Proto   string
	Close   bool
	Length  int64
	TE      []string
	CType   string
	Field   []string // the field the handler set, if any
	Body    string
}

// diffResult is one server's side of a differential exchange.
type diffResult struct {
	Calls    []diffCall
	Resps    []diffResp
	ParseErr string // the response stream did not parse
	TimedOut bool
}

// diffTimeout bounds one exchange; reaching it is a finding (a hang), not
// a timing threshold.
const diffTimeout = 10 * time.Second

// exchange sends input on a new connection, half-closes it and reads the
// answer until the server closes the connection.
func (d *diffServer) exchange(input []byte, field string) diffResult {
	var res diffResult
	c, err := net.Dial(d.network, d.addr)
	if err != nil {
		res.ParseErr = "dial: " + err.Error()
		return res
	}
	_ = c.SetDeadline(time.Now().Add(diffTimeout))
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = c.Write(input)
		_ = c.(interface{ CloseWrite() error }).CloseWrite()
	})
	raw, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		res.TimedOut = true
	}
	c.Close()
	wg.Wait()
	res.Calls = d.rec.take()
	br := bufio.NewReader(bytes.NewReader(raw))
	for i := 0; ; {
		if _, err := br.Peek(1); err != nil {
			break
		}
		method := http.MethodGet
		if i < len(res.Calls) {
			method = res.Calls[i].Method
		}
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			res.ParseErr = "response " + strconv.Itoa(len(res.Resps)) + ": " + err.Error()
			break
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			res.ParseErr = "response body " + strconv.Itoa(len(res.Resps)) + ": " + err.Error()
			break
		}
		r := diffResp{Status: resp.StatusCode, Handler: resp.Header.Get("X-Handler") == "1"}
		if r.Handler {
			r.Proto, r.Close, r.Length, r.TE = resp.Proto, resp.Close, resp.ContentLength, resp.TransferEncoding
			r.CType, r.Body = resp.Header.Get("Content-Type"), string(b)
			if field != "" {
				r.Field = resp.Header.Values(field)
			}
		}
		res.Resps = append(res.Resps, r)
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			i++
		}
	}
	return res
}

// queryField returns the response field the input's first request asks
// the handler to set (h=...), canonicalized as the client reads it.
func queryField(input []byte) string {
	i := bytes.Index(input, []byte("h="))
	if i < 0 {
		return ""
	}
	s := input[i+2:]
	if j := bytes.IndexAny(s, "& \r\n"); j >= 0 {
		s = s[:j]
	}
	return http.CanonicalHeaderKey(string(s))
}

// diffOne runs input through both servers at once and describes the
// differences, or returns "".
func diffOne(lean, std *diffServer, input []byte) string {
	field := queryField(input)
	var l, s diffResult
	var wg sync.WaitGroup
	wg.Go(func() { l = lean.exchange(input, field) })
	wg.Go(func() { s = std.exchange(input, field) })
	wg.Wait()
	acceptAmbiguousClose(input, &l, &s)
	return compareResults(l, s)
}

// acceptAmbiguousClose applies accepted difference 4 to an exchange whose
// input has a Transfer-Encoding field: when this server's last answer is
// the handler's, announces the close, and net/http's answer in its place
// does not, net/http's later calls and answers are dropped and the close
// is compared as net/http's. What comes before is compared as usual.
func acceptAmbiguousClose(input []byte, l, s *diffResult) {
	if !bytes.Contains(bytes.ToLower(input), []byte("transfer-encoding")) {
		return
	}
	n := len(l.Resps)
	if n == 0 || n > len(s.Resps) || len(l.Calls) > len(s.Calls) {
		return
	}
	if last := &l.Resps[n-1]; last.Handler && last.Close && s.Resps[n-1].Handler && !s.Resps[n-1].Close {
		last.Close = false
		s.Resps, s.Calls = s.Resps[:n], s.Calls[:len(l.Calls)]
	}
}

func compareResults(l, s diffResult) string {
	var out []string
	if l.TimedOut != s.TimedOut {
		out = append(out, fmt.Sprintf("timed out: lean %v, std %v", l.TimedOut, s.TimedOut))
	}
	if (l.ParseErr == "") != (s.ParseErr == "") {
		out = append(out, fmt.Sprintf("response parse: lean %q, std %q", l.ParseErr, s.ParseErr))
	}
	if a, b := fmt.Sprintf("%+v", l.Calls), fmt.Sprintf("%+v", s.Calls); a != b {
		out = append(out, fmt.Sprintf("handler calls differ:\n  lean %s\n  std  %s", a, b))
	}
	if len(l.Resps) != len(s.Resps) {
		out = append(out, fmt.Sprintf("responses: lean %d %s, std %d %s", len(l.Resps), statuses(l.Resps), len(s.Resps), statuses(s.Resps)))
	} else {
		for i := range l.Resps {
			a, b := l.Resps[i], s.Resps[i]
			if !a.Handler || !b.Handler {
				// Accepted difference 2: a server's own answer is
				// compared by its status code only.
				a, b = diffResp{Status: a.Status, Handler: a.Handler}, diffResp{Status: b.Status, Handler: b.Handler}
			}
			if fmt.Sprintf("%+v", a) != fmt.Sprintf("%+v", b) {
				out = append(out, fmt.Sprintf("response %d differs:\n  lean %+v\n  std  %+v", i, a, b))
			}
		}
	}
	return strings.Join(out, "\n")
}

func statuses(rs []diffResp) string {
	var s []string
	for _, r := range rs {
		s = append(s, strconv.Itoa(r.Status))
	}
	return "[" + strings.Join(s, " ") + "]"
}

// FuzzDifferential compares this server with net/http's on the same
// request bytes (see diff_test.go's top comment). `go test` runs the seed
// corpus (diffSeeds and testdata/fuzz/FuzzDifferential); a long run:
//
//	go test ./internal/httpserver -run '^$' -fuzz FuzzDifferential -fuzztime 30m
func FuzzDifferential(f *testing.F) {
	for _, s := range diffSeeds() {
		f.Add([]byte(s))
	}
	lean, std := startDiffServers(f)
	f.Fuzz(func(t *testing.T, input []byte) {
		if len(input) > 64<<10 {
			return
		}
		if d := diffOne(lean, std, input); d != "" {
			t.Fatalf("lean and net/http servers differ on %q:\n%s", input, d)
		}
	})
}

// TestDifferentialGenerated runs requests built from a grammar of valid
// and hostile pieces (diffGen) through both servers: deterministic, and
// more structured than the fuzzer's mutations. HTTPSERVER_DIFF_N sets the
// number of inputs (default 2000, 300 with -short).
func TestDifferentialGenerated(t *testing.T) {
	n := 2000
	if testing.Short() {
		n = 300
	}
	if v, err := strconv.Atoi(os.Getenv("HTTPSERVER_DIFF_N")); err == nil {
		n = v
	}
	lean, std := startDiffServers(t)
	g := newDiffGen(1)
	failures := 0
	for i := range n {
		input := g.input()
		if d := diffOne(lean, std, input); d != "" {
			t.Errorf("input %d %q:\n%s", i, input, d)
			if failures++; failures >= 10 {
				t.Fatal("too many differences")
			}
		}
	}
}
