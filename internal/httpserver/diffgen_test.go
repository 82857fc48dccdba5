package httpserver

import (
	"io"
	"log"
	"math/rand/v2"
	"strings"
)

func newDiscardLog() *log.Logger { return log.New(io.Discard, "", 0) }

// diffSeeds is the seed corpus of FuzzDifferential: valid requests,
// pipelining, chunked bodies, and smuggling and parsing attacks.
func diffSeeds() []string {
	const h = "Host: x\r\n"
	return []string{
		// Valid requests and pipelining.
		"GET / HTTP/1.1\r\n" + h + "\r\n",
		"GET /a?b=c HTTP/1.1\r\n" + h + "\r\nGET /b HTTP/1.1\r\n" + h + "\r\n",
		"POST /e HTTP/1.1\r\n" + h + "Content-Length: 5\r\n\r\nhelloGET /f HTTP/1.1\r\n" + h + "\r\n",
		"POST /e HTTP/1.1\r\n" + h + "Content-Length: 1\r\n\r\nx\r\nGET /after-post-crlf HTTP/1.1\r\n" + h + "\r\n",
		"HEAD /big HTTP/1.1\r\n" + h + "\r\nGET /big HTTP/1.1\r\n" + h + "\r\n",
		"GET /a HTTP/1.0\r\n\r\n",
		"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
		"GET /big HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\n\r\n",
		"GET /a HTTP/1.1\r\n" + h + "Connection: close\r\n\r\nGET /b HTTP/1.1\r\n" + h + "\r\n",
		"GET /status?s=204 HTTP/1.1\r\n" + h + "\r\nGET /status?s=304 HTTP/1.1\r\n" + h + "\r\n",
		"GET /flush HTTP/1.1\r\n" + h + "\r\n",
		"POST /flush HTTP/1.1\r\n" + h + "Content-Length: 3\r\n\r\nabcGET /n HTTP/1.1\r\n" + h + "\r\n",
		"OPTIONS * HTTP/1.1\r\n" + h + "\r\nGET /after-options HTTP/1.1\r\n" + h + "\r\n",
		"OPTIONS * HTTP/1.1\r\n" + h + "Content-Length: 5000\r\n\r\n" + strings.Repeat("o", 5000) + "GET /x HTTP/1.1\r\n" + h + "\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"CONNECT example.com:443 HTTP/1.1\r\n\r\n",
		"GET http://x/abs HTTP/1.1\r\n" + h + "\r\n",
		// Chunked bodies.
		"POST /c HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nGET /n HTTP/1.1\r\n" + h + "\r\n",
		"POST /c HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n1\r\na\r\n0\r\nX-T: 1\r\n\r\nGET /n HTTP/1.1\r\n" + h + "\r\n",
		"POST /noread HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /n HTTP/1.1\r\n" + h + "\r\n",
		"POST /close HTTP/1.1\r\n" + h + "Content-Length: 3\r\n\r\nabcGET /n HTTP/1.1\r\n" + h + "\r\n",
		"POST /partial HTTP/1.1\r\n" + h + "Content-Length: 10\r\n\r\n0123456789GET /n HTTP/1.1\r\n" + h + "\r\n",
		"POST /c HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
		"POST /c HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\n\r\n",
		"POST /c HTTP/1.1\r\n" + h + "Expect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
		"POST /noread HTTP/1.1\r\n" + h + "Expect: 100-continue\r\nContent-Length: 3\r\n\r\nabcGET /n HTTP/1.1\r\n" + h + "\r\n",
		"POST /c HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
		"POST /c HTTP/1.1\r\n" + h + "Expect: magic\r\nContent-Length: 3\r\n\r\nabc",
		// Smuggling: CL.TE, TE.CL, duplicate CL, whitespace, obs-fold.
		"POST /s HTTP/1.1\r\n" + h + "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n" + h + "\r\n",
		"POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
		"POST /s HTTP/1.1\r\n" + h + "Content-Length: 3\r\nContent-Length: 5\r\n\r\nabcde",
		"POST /s HTTP/1.1\r\n" + h + "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
		"POST /s HTTP/1.1\r\n" + h + "Content-Length: 3, 3\r\n\r\nabc",
		"POST /s HTTP/1.1\r\n" + h + "Content-Length: +3\r\n\r\nabc",
		"GET /s HTTP/1.1\r\n" + h + "Content-Length : 32\r\n\r\nGET /smuggled HTTP/1.1\r\n" + h + "\r\n",
		"POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n" + h + "\r\n",
		"POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
		"POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip\r\n\r\n",
		"POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding:\tchunked\r\n\r\n0\r\n\r\n",
		"POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
		"POST /s HTTP/1.1\r\n" + h + "X-A: a\r\n Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET /fold HTTP/1.1\r\nHost: x\r\n y\r\n\r\n",
		"GET /fold HTTP/1.1\r\nX-A: a\r\n\tb\r\n" + h + "\r\n",
		"GET /s HTTP/1.1\r\n" + h + "X Foo: bar\r\n\r\n",
		"GET /s HTTP/1.1\r\n" + h + " X-Lead: y\r\n\r\n",
		// Host.
		"GET /h HTTP/1.1\r\n\r\n",
		"GET /h HTTP/1.1\r\nHost:\r\n\r\n",
		"GET /h HTTP/1.1\r\nHost: a b\r\n\r\n",
		"GET /h HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
		"GET /h HTTP/1.1\r\nhOsT: x\r\n\r\n",
		"GET http://x/h HTTP/1.1\r\n\r\n",
		"GET http://x/h HTTP/1.1\r\nHost: a b\r\n\r\n",
		"GET http://x/h HTTP/1.1\r\nHost:\r\n\r\n",
		// Bare LF, NUL, bad lines and targets.
		"GET /lf HTTP/1.1\nHost: x\n\nGET /lf2 HTTP/1.1\nHost: x\n\n",
		"GET /nul HTTP/1.1\r\n" + h + "X-A: a\x00b\r\n\r\n",
		"GET /nul\x00 HTTP/1.1\r\n" + h + "\r\n",
		"GET /cr HTTP/1.1\r\n" + h + "X-A: a\rb\r\n\r\n",
		"GET x HTTP/1.1\r\n" + h + "\r\n",
		"GET /%zz HTTP/1.1\r\n" + h + "\r\n",
		"GET / HTTP/1.1 \r\n" + h + "\r\n",
		"GET  / HTTP/1.1\r\n" + h + "\r\n",
		"G@T / HTTP/1.1\r\n" + h + "\r\n",
		"GET / HTTP/0.9\r\n" + h + "\r\n",
		"GET / HTTP/1.5\r\n" + h + "\r\n",
		"GET / HTTP/2.0\r\n" + h + "\r\n",
		"GET / HTTP/1.1\r\n" + h,
		"GE",
		"\r\nGET / HTTP/1.1\r\n" + h + "\r\n",
		"GARBAGE\r\n\r\n",
		// Header sizes and the handler's fields.
		"GET /big-head HTTP/1.1\r\n" + h + "X-Big: " + strings.Repeat("b", 3000) + "\r\n\r\n",
		"GET /many HTTP/1.1\r\n" + h + strings.Repeat("X-A: b\r\n", 600) + "\r\n",
		"GET /f?h=X-Test&v=a%0d%0aX-Injected:%20b HTTP/1.1\r\n" + h + "\r\n",
		"GET /f?h=X-Test%0d%0aX-Injected:%20b&v=1 HTTP/1.1\r\n" + h + "\r\n",
		"GET /f?h=X%20Test&v=1 HTTP/1.1\r\n" + h + "\r\n",
		"GET /f?h=X-Test&v=a%00b HTTP/1.1\r\n" + h + "\r\n",
		"GET /f?h=X-Test&v=%20%20a%09 HTTP/1.1\r\n" + h + "\r\n",
	}
}

// diffGen builds request byte strings from a grammar of valid and hostile
// pieces, deterministically from its seed.
type diffGen struct{ r *rand.Rand }

func newDiffGen(seed uint64) *diffGen {
	return &diffGen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (g *diffGen) pick(s []string) string { return s[g.r.IntN(len(s))] }

// one returns the usual piece with probability p, else a random other.
func (g *diffGen) one(usual string, p float64, others []string) string {
	if g.r.Float64() < p {
		return usual
	}
	return g.pick(others)
}

func (g *diffGen) input() []byte {
	var b strings.Builder
	n := 1 + g.r.IntN(3)
	for range n {
		b.WriteString(g.request())
		if g.r.IntN(10) == 0 {
			b.WriteString(g.pick([]string{"\r\n", "\n", "\r\n\r\n", " ", "\x00"}))
		}
	}
	if g.r.IntN(8) == 0 { // cut short
		s := b.String()
		return []byte(s[:g.r.IntN(len(s)+1)])
	}
	return []byte(b.String())
}

var (
	genMethods = []string{"POST", "HEAD", "OPTIONS", "PUT", "CONNECT", "PRI", "get", "G E T", "", "GET\x00", "DELETE", "X-CUSTOM"}
	genTargets = []string{"/", "/noread", "/close", "/partial", "/flush", "/big", "/status?s=204", "/status?s=304", "/status?s=418",
		"*", "http://x/abs", "http://x", "x", "/%zz", "//a", "/a b", "", "/\x7f", "/a?b=%zz", "/f?h=X-T&v=a%0d%0ab",
		"/f?h=X-T%0aY&v=1", "/f?h=X%20T&v=1", "/f?h=X-T&v=a%00b", "example.com:443", "/a#frag", "/%00"}
	genVersions = []string{"HTTP/1.0", "HTTP/2.0", "HTTP/0.9", "HTTP/1.2", "HTTP/11", "http/1.1", "", "HTTP/1.1 ", "HTTP/1"}
	genHosts    = []string{"", "Host:\r\n", "Host: a b\r\n", "Host: x\r\nHost: y\r\n", "hoST: x\r\n", "Host : x\r\n",
		"Host: x:99999\r\n", "Host: [::1]:80\r\n", "Host: x\x00\r\n", "Host:\r\n x\r\n", "Host: x\r\n\tx\r\n", "Host: é\r\n"}
	genFields = []string{"Content-Length: 5\r\n", "Content-Length : 5\r\n", "Content-Length: 5, 5\r\n", "Content-Length: -1\r\n",
		"Content-Length: 5\r\nContent-Length: 6\r\n", "Content-Length: 0\r\n", "Content-Length: 99999999999999999999\r\n",
		"Transfer-Encoding: chunked\r\n", "Transfer-Encoding : chunked\r\n", "Transfer-Encoding: gzip, chunked\r\n",
		"Transfer-Encoding: identity\r\n", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "Transfer-Encoding: CHUNKED\r\n",
		"Expect: 100-continue\r\n", "Expect: foo\r\n", "Expect: 100-continue, foo\r\n", "Connection: close\r\n", "Connection: keep-alive\r\n",
		"Connection: keep-alive, close\r\n", "Connection: Upgrade\r\nUpgrade: h2c\r\n", "X Foo: bar\r\n", "X-Foo: a\x00b\r\n",
		"X-Foo: a\r\n b\r\n", "\x00: x\r\n", "X-Foo:\tbar\t\r\n", " X-Lead: y\r\n", "Pragma: no-cache\r\n", "Trailer: X-T\r\n",
		"X-Foo: \xff\r\n", ": empty\r\n", "X-Foo\r\n", "X-Foo: a\rb\r\n", "X-Long: " + strings.Repeat("l", 2100) + "\r\n",
		"Cookie: a=b\r\nCookie: c=d\r\n", "Accept: */*\r\n"}
	genBodies = []string{"", "hello", "5\r\nhello\r\n0\r\n\r\n", "0\r\n\r\n", "zz\r\nabc\r\n0\r\n\r\n", "3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
		"5\r\nhel", "3;x=y\r\nabc\r\n0\r\n\r\n", "3\r\nabcXX\r\n0\r\n\r\n", "hello world, a longer body", "\r\n"}
)

func (g *diffGen) request() string {
	eol := g.one("\r\n", 0.9, []string{"\n"})
	var b strings.Builder
	b.WriteString(g.one("GET", 0.6, genMethods) + " " + g.one("/", 0.3, genTargets) + " " + g.one("HTTP/1.1", 0.8, genVersions) + eol)
	b.WriteString(g.one("Host: x"+eol, 0.8, genHosts))
	for range g.r.IntN(4) {
		f := g.pick(genFields)
		if eol == "\n" {
			f = strings.ReplaceAll(f, "\r\n", "\n")
		}
		b.WriteString(f)
	}
	b.WriteString(eol)
	b.WriteString(g.pick(genBodies))
	return b.String()
}
