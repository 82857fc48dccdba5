package httpserver

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/examlops/gateway/internal/netlimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEarlyAnswerBehindNetlimit is TestEarlyAnswerSurvivesUnreadBody
// behind the gateway's connection limit (found in review: the limit's
// wrapper hid CloseWrite, and early answers were reset away).
func TestEarlyAnswerBehindNetlimit(t *testing.T) {
	s, err := New(http.HandlerFunc(reject413), Options{Logger: quietLogger()})
	require.NoError(t, err)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = s.Serve(netlimit.New(tcp, 16)) }()
	defer s.Close()
	body := make([]byte, 32<<20)
	fails := 0
	for i := range 10 {
		resp, err := http.Post("http://"+tcp.Addr().String()+"/", "application/octet-stream", bytes.NewReader(body))
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		if err != nil {
			fails++
			t.Logf("request %d: %v", i, err)
		}
	}
	assert.Zero(t, fails, "answers lost of 10")
}
