package httpserver

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
)

// BenchmarkFrontServer measures one request and response over a kept-alive
// loopback connection, with a handler that reads a small body and answers
// 200 bytes with a Content-Length, through net/http's server and the lean
// server: the round trip of the front server alone.
func BenchmarkFrontServer(b *testing.B) {
	answer := make([]byte, 200)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		_, _ = w.Write(answer)
	})
	body := `{"model":"m1","messages":[{"role":"user","content":"Say one word."}]}`
	raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
	for _, front := range []string{"std", "lean"} {
		b.Run(front, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			if front == "std" {
				hs := &http.Server{Handler: h}
				go func() { _ = hs.Serve(ln) }()
				defer hs.Close()
			} else {
				ls, err := New(h, Options{Logger: quietLogger()})
				if err != nil {
					b.Fatal(err)
				}
				go func() { _ = ls.Serve(ln) }()
				defer ls.Close()
			}
			conn, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			br := bufio.NewReader(conn)
			req := &http.Request{Method: http.MethodPost}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := io.WriteString(conn, raw); err != nil {
					b.Fatal(err)
				}
				resp, err := http.ReadResponse(br, req)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, resp.Body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
