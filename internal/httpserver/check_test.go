package httpserver

import (
	"bufio"
	"bytes"
	"net/textproto"
	"testing"

	"github.com/stretchr/testify/assert"
	"golang.org/x/net/http/httpguts"
)

// FuzzHeadScan checks headEnd and scanHost, which read a request head's
// bytes before or beside http.ReadRequest, against net/textproto (which
// http.ReadRequest reads the head with): whenever textproto reads a
// request line and header fields from the input, headEnd finds the bytes
// textproto consumed, and scanHost the same number of Host fields and the
// same validity of the first one's value, and whether there are
// Transfer-Encoding and Content-Length fields.
func FuzzHeadScan(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\nhost:  x \n\nrest",
		"GET / HTTP/1.1\r\nHost: x\r\n y\r\n\r\n",
		"GET / HTTP/1.1\r\nHost:\r\n\tx\r\n \r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost : a\r\nX: y\r\n\r\n",
		"GET / HTTP/1.1\r\nX-A: 1\r\nHOST: [::1]:8080\r\n\r\nGET",
		"\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\n\r",
		"POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\nContent-Length:\r\n\r\n",
		"POST / HTTP/1.1\r\nX: a\r\n Transfer-Encoding: chunked\r\nContent-Length : 1\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		br := bufio.NewReader(r)
		tp := textproto.NewReader(br)
		if _, err := tp.ReadLine(); err != nil {
			return
		}
		m, err := tp.ReadMIMEHeader()
		if err != nil {
			return
		}
		consumed := len(in) - br.Buffered() - r.Len()
		assert.Equal(t, consumed, headEnd(in), "head length")
		hf := scanHost(in[:consumed])
		hosts := m["Host"]
		assert.Equal(t, len(hosts), hf.n, "Host fields")
		_, te := m["Transfer-Encoding"]
		_, cl := m["Content-Length"]
		assert.Equal(t, te, hf.te, "Transfer-Encoding field")
		assert.Equal(t, cl, hf.cl, "Content-Length field")
		if len(hosts) == 1 {
			assert.Equal(t, httpguts.ValidHostHeader(hosts[0]), hf.valid, "Host value %q valid", hosts[0])
		}
	})
}

func TestHasToken(t *testing.T) {
	for _, tt := range []struct {
		v    string
		want bool
	}{
		{"close", true}, {"Close", true}, {"keep-alive, close", true}, {"close,foo", true}, {"foo close", true},
		{"\tclose\t", true}, {"closed", false}, {"xclose", false}, {"clos", false}, {"", false}, {"c\x0dose", false},
	} {
		assert.Equal(t, tt.want, hasToken(tt.v, "close"), "%q", tt.v)
	}
	assert.False(t, hasToken("100-continuE\r", "100-continue"))
	assert.True(t, hasToken("100-CONTINUE", "100-continue"))
}
