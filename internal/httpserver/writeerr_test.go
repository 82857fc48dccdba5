package httpserver

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handler's Write returns what net/http's returns: ErrContentLength
// past a declared length on a HEAD answer too (its body is not sent, but
// it is counted), and no error for an empty write where a body is not
// allowed (found in review: nil and ErrBodyNotAllowed).
func TestWriteErrorsLikeNetHTTP(t *testing.T) {
	errs := make(chan string, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n int
		var err error
		switch r.URL.Path {
		case "/over":
			w.Header().Set("Content-Length", "2")
			n, err = io.WriteString(w, "abc")
		case "/empty304":
			w.WriteHeader(http.StatusNotModified)
			n, err = w.Write(nil)
		case "/body304":
			w.WriteHeader(http.StatusNotModified)
			n, err = io.WriteString(w, "x")
		}
		errs <- fmt.Sprint(n, err)
	})
	leanAddr, _ := startServer(t, h, Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: h, ErrorLog: newDiscardLog()}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })

	for _, req := range []struct{ method, path string }{{"HEAD", "/over"}, {"GET", "/over"}, {"GET", "/empty304"}, {"GET", "/body304"}} {
		var got []string
		for _, addr := range []string{leanAddr, ln.Addr().String()} {
			r, err := http.NewRequest(req.method, "http://"+addr+req.path, nil)
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(r)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			got = append(got, <-errs)
		}
		assert.Equal(t, got[1], got[0], "%s %s: Write's result, lean vs net/http", req.method, req.path)
	}
}
