package httpserver

import (
	"bytes"
	"net/http"

	"golang.org/x/net/http/httpguts"
)

// hostFields is what a request head says of its Host field, which
// http.ReadRequest does not keep, and of its framing fields, which it
// drops in some cases (Content-Length beside a chunked Transfer-Encoding,
// Transfer-Encoding on HTTP/1.0).
type hostFields struct {
	n     int  // how many Host fields the head has
	valid bool // the first one's value is a valid Host value
	te    bool // the head has a Transfer-Encoding field
	cl    bool // the head has a Content-Length field
}

// ambiguousFraming reports whether a request's framing may be read
// otherwise by an intermediary (request smuggling): Transfer-Encoding
// beside Content-Length, or on HTTP/1.0, which net/http ignores (issue
// 12785). RFC 9112 §6.1 and §6.3: the server "MUST close the connection
// after responding to such a request"; net/http does not.
func (hf hostFields) ambiguousFraming(req *http.Request) bool {
	return hf.te && (hf.cl || !req.ProtoAtLeast(1, 1))
}

// checkRequest applies to a request read by http.ReadRequest the checks
// net/http's server makes after reading it (Go 1.26 net/http/server.go,
// conn.readRequest), and returns the status code and reason of a
// rejection, or 0. RFC 9112 §3.2 (Host), §5.1 (field names).
func checkRequest(req *http.Request, host hostFields) (int, string) {
	if req.ProtoMajor != 1 && !(req.ProtoMajor == 2 && req.ProtoMinor == 0 && req.Method == "PRI" && req.RequestURI == "*") {
		return http.StatusHTTPVersionNotSupported, "unsupported protocol version"
	}
	// The HTTP/2 preface as a request: net/http hands it to the handler
	// (and closes the connection after).
	h2Preface := req.Method == "PRI" && len(req.Header) == 0 && host.n == 0 && req.URL.Path == "*" && req.Proto == "HTTP/2.0"
	if req.ProtoAtLeast(1, 1) && host.n == 0 && !h2Preface && req.Method != http.MethodConnect {
		return http.StatusBadRequest, "missing required Host header"
	}
	if host.n == 1 && !host.valid {
		return http.StatusBadRequest, "malformed Host header"
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return http.StatusBadRequest, "invalid header name"
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return http.StatusBadRequest, "invalid header value"
			}
		}
	}
	return 0, ""
}

// scanHost reads the Host fields of a request head (request line, fields,
// up to the empty line), and notes whether it has Transfer-Encoding and
// Content-Length fields, as net/textproto reads fields: a line ends at LF,
// less one CR before it; a line starting with a space or tab continues
// the field before it (obs-fold: joined by one space, each line trimmed
// of spaces and tabs); the field name is what precedes the first colon,
// and "host" in any case is the Host field (a name with other bytes, a
// space before the colon say, is another field, which checkRequest
// rejects). The value is the rest of the joined line, trimmed.
func scanHost(head []byte) hostFields {
	var hf hostFields
	_, rest := nextLine(head) // the request line
	var first []byte          // the first Host field's line, trimmed
	var folded []byte         // and its continuations, if any
	inFirst := false
	for len(rest) > 0 {
		var line []byte
		line, rest = nextLine(rest)
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			if inFirst {
				if folded == nil {
					folded = append([]byte(nil), first...)
				}
				folded = append(append(folded, ' '), trimSpaceTab(line)...)
			}
			continue
		}
		inFirst = false
		if !isField(line, "host") {
			hf.te = hf.te || isField(line, "transfer-encoding")
			hf.cl = hf.cl || isField(line, "content-length")
			continue
		}
		hf.n++
		if hf.n == 1 {
			inFirst = true
			first = trimSpaceTab(line)
		}
	}
	if hf.n > 0 {
		if folded != nil {
			first = folded
		}
		hf.valid = httpguts.ValidHostHeader(string(bytes.TrimLeft(first[5:], " \t")))
	}
	return hf
}

// isField reports whether line is a field named name (lower-case ASCII),
// in any case.
func isField(line []byte, name string) bool {
	return len(line) > len(name) && line[len(name)] == ':' && asciiEqualFold(line[:len(name)], name)
}

// nextLine splits b after its first line, which it returns without its
// LF and one CR before it.
func nextLine(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return b, nil
	}
	line, rest = b[:i], b[i+1:]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	return line, rest
}

func trimSpaceTab(b []byte) []byte { return bytes.Trim(b, " \t") }

// asciiEqualFold reports whether b equals the lower-case ASCII s, ignoring
// the case of ASCII letters.
func asciiEqualFold[T string | []byte](b T, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// hasToken reports whether v holds token (lower-case ASCII) as a word
// bounded by the start, the end, a space, a tab or a comma, ignoring case:
// net/http's test of the Connection and Expect values ("close",
// "keep-alive", "100-continue").
func hasToken(v, token string) bool {
	for i := 0; i+len(token) <= len(v); i++ {
		if i > 0 && !isTokenBoundary(v[i-1]) {
			continue
		}
		if end := i + len(token); end < len(v) && !isTokenBoundary(v[end]) {
			continue
		}
		if asciiEqualFold(v[i:i+len(token)], token) {
			return true
		}
	}
	return false
}

func isTokenBoundary(b byte) bool { return b == ' ' || b == ',' || b == '\t' }
