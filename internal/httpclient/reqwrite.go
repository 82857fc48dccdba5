package httpclient

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// defaultUserAgent is the User-Agent net/http sends when a request has
// none; writeRequest sends the same.
const defaultUserAgent = "Go-http-client/1.1"

// errBodyLength reports a request body that did not hold ContentLength
// bytes.
var errBodyLength = errors.New("request body length differs from ContentLength")

// writeRequest writes req to bw in HTTP/1.1 wire format, as req.Write
// does, but without its formatting overhead (fmt, sorted headers, a body
// copier) for the requests the gateway sends: a plain method and URL, an
// ASCII host, a body of known length (or none), headers without line
// breaks. Any other request is written by req.Write. Like req.Write it
// closes the body.
func writeRequest(bw *bufio.Writer, req *http.Request) error {
	if !simpleRequest(req) {
		return req.Write(bw)
	}
	uri := req.URL.RequestURI()
	if !plainText(uri) || strings.ContainsAny(uri, " \t") {
		return req.Write(bw)
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	bw.WriteString(req.Method)
	bw.WriteByte(' ')
	bw.WriteString(uri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	ua := defaultUserAgent
	if v, ok := req.Header["User-Agent"]; ok {
		ua = ""
		if len(v) > 0 {
			ua = v[0]
		}
	}
	if ua != "" {
		bw.WriteString("User-Agent: ")
		bw.WriteString(ua)
		bw.WriteString("\r\n")
	}
	if req.ContentLength > 0 || req.Method == http.MethodPost || req.Method == http.MethodPut || req.Method == http.MethodPatch {
		bw.WriteString("Content-Length: ")
		var num [20]byte
		bw.Write(strconv.AppendInt(num[:0], req.ContentLength, 10))
		bw.WriteString("\r\n")
	}
	for k, vv := range req.Header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		for _, v := range vv {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(strings.Trim(v, " \t"))
			bw.WriteString("\r\n")
		}
	}
	_, err := bw.WriteString("\r\n")
	if req.Body == nil || req.Body == http.NoBody {
		return err
	}
	defer req.Body.Close()
	if err != nil {
		return err
	}
	n, err := io.CopyN(bw, req.Body, req.ContentLength)
	if err == io.EOF {
		return fmt.Errorf("%w: ContentLength=%d with Body length %d", errBodyLength, req.ContentLength, n)
	}
	if err != nil {
		return err
	}
	var extra [1]byte
	if m, _ := io.ReadFull(req.Body, extra[:]); m > 0 {
		return fmt.Errorf("%w: ContentLength=%d with a longer Body", errBodyLength, req.ContentLength)
	}
	return nil
}

// simpleRequest reports whether writeRequest can write req itself: the
// wire format then follows from the fields below without the escaping,
// defaults and checks req.Write applies to anything else.
func simpleRequest(req *http.Request) bool {
	switch req.Method {
	case http.MethodGet, http.MethodPost:
	default:
		return false
	}
	if req.URL == nil || req.URL.Opaque != "" || req.Close || len(req.TransferEncoding) > 0 || len(req.Trailer) > 0 {
		return false
	}
	if req.ContentLength < 0 || (req.ContentLength == 0 && req.Body != nil && req.Body != http.NoBody) {
		return false // unknown length: req.Write sends it chunked
	}
	if req.ContentLength > 0 && req.Body == nil {
		return false // req.Write reports the error
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if host == "" || !plainText(host) || strings.ContainsAny(host, "% /") {
		return false // zones, punycode and the like are req.Write's
	}
	for k, vv := range req.Header {
		if !headerToken(k) {
			return false
		}
		for _, v := range vv {
			if !plainText(v) {
				return false
			}
		}
	}
	return true
}

// plainText reports whether s is printable ASCII (spaces and tabs
// allowed), so that it cannot break a header line.
func plainText(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c >= 0x7f {
			return false
		}
	}
	return true
}

// headerToken reports whether s is a non-empty HTTP token (RFC 9110), as a
// header name must be.
func headerToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
