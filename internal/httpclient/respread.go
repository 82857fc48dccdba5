package httpclient

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
)

// readResponse reads a response to req from br, as http.ReadResponse
// does. The common answer of an engine (HTTP/1.1, a Content-Length, plain
// headers, the whole head already received) is decoded directly from the
// buffer, with one string for the whole head; anything else is left to
// http.ReadResponse, which then reads it from the start.
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	if _, err := br.Peek(1); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // as http.ReadResponse reports it
		}
		return nil, err
	}
	buf, _ := br.Peek(br.Buffered())
	if resp, n := parseSimpleResponse(buf, br, req); resp != nil {
		_, _ = br.Discard(n)
		return resp, nil
	}
	return http.ReadResponse(br, req)
}

// parseSimpleResponse decodes the response head at the start of buf if it
// is complete and simple (see readResponse), returning the response, whose
// body then reads from br, and the head's length; else nil.
func parseSimpleResponse(buf []byte, br *bufio.Reader, req *http.Request) (*http.Response, int) {
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 || !bytes.HasPrefix(buf, []byte("HTTP/1.1 ")) || req.Method == http.MethodHead {
		return nil, 0
	}
	head := string(buf[:end+2]) // every line with its CRLF
	line, rest, _ := strings.Cut(head, "\r\n")
	status := line[len("HTTP/1.1 "):]
	if len(status) < 3 || (len(status) > 3 && status[3] != ' ') || !plainText(status) {
		return nil, 0
	}
	code, err := strconv.Atoi(status[:3])
	if err != nil || code < 200 || code > 599 || code == http.StatusNoContent || code == http.StatusNotModified {
		return nil, 0 // 1xx and bodiless answers are http.ReadResponse's
	}
	lines := strings.Count(rest, "\r\n")
	h := make(http.Header, lines)
	vals := make([]string, 0, lines) // the values share one backing array
	length := int64(-1)
	cacheControl, pragma := false, false
	for rest != "" {
		line, rest, _ = strings.Cut(rest, "\r\n")
		k, v, ok := strings.Cut(line, ":")
		if !ok || !headerToken(k) || !plainText(v) {
			return nil, 0 // also folded lines, which start with a space
		}
		v = strings.Trim(v, " \t")
		k = textproto.CanonicalMIMEHeaderKey(k)
		switch k {
		case "Content-Length":
			if length >= 0 || v == "" || strings.Trim(v, "0123456789") != "" || len(v) > 18 {
				return nil, 0 // repeated or malformed
			}
			length, _ = strconv.ParseInt(v, 10, 64)
		case "Transfer-Encoding", "Trailer", "Connection":
			return nil, 0 // net/http may rewrite these (Connection: close is dropped)
		case "Cache-Control":
			cacheControl = true
		case "Pragma":
			pragma = true
		}
		i := len(vals)
		vals = append(vals, v)
		if old := h[k]; old != nil {
			// A repeated header: give it its own slice.
			h[k] = append(old[:len(old):len(old)], v)
			continue
		}
		h[k] = vals[i : i+1 : i+1]
	}
	if length < 0 || (pragma && !cacheControl) {
		return nil, 0 // no length, or net/http would add Cache-Control
	}
	resp := &http.Response{
		Status:        status,
		StatusCode:    code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		ContentLength: length,
		Request:       req,
		Body:          http.NoBody,
	}
	if length > 0 {
		resp.Body = &lengthBody{br: br, n: length}
	}
	return resp, end + 4
}

// lengthBody reads a body of known length from the connection's reader,
// reporting io.EOF with the last bytes (as net/http's bodies do) and
// io.ErrUnexpectedEOF if the connection ends first.
type lengthBody struct {
	br *bufio.Reader
	n  int64
}

func (b *lengthBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	m, err := b.br.Read(p)
	b.n -= int64(m)
	switch {
	case err == io.EOF && b.n > 0:
		err = io.ErrUnexpectedEOF
	case err == nil && b.n == 0:
		err = io.EOF
	}
	return m, err
}

func (b *lengthBody) Close() error { return nil }
