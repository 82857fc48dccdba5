package picker

import (
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// TestOutcomeMeasures: what the picker measures of an answer in each
// response body mode (gateway.DoneInfo's TTFT, Elapsed, OutputTokens): the
// time to the first chunk of an event stream only when chunks come as
// sent (FULL_DUPLEX_STREAMED, STREAMED), the end whenever it is seen, the
// output tokens whenever the body is (its usage, else a stream's content
// chunks).
func TestOutcomeMeasures(t *testing.T) {
	const (
		sse  = "text/event-stream"
		json = "application/json"
	)
	jsonBody := [][]byte{[]byte(`{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":3,"completion_tokens":7}}`)}
	sseBody := [][]byte{[]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"),
		[]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n")}
	const (
		full     = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		streamed = extprocfilterv3.ProcessingMode_STREAMED
		buffered = extprocfilterv3.ProcessingMode_BUFFERED
		none     = extprocfilterv3.ProcessingMode_NONE
	)
	s := time.Second
	// Clock readings, one second apart: request headers 1s, routing 2s,
	// the first token 3s (the headers of a plain answer, the first chunk
	// of a stream), the end 4s.
	for _, tc := range []struct {
		name    string
		mode    extprocfilterv3.ProcessingMode_BodySendMode
		ct      string
		status  string
		body    [][]byte
		latency time.Duration
		ttft    time.Duration
		elapsed time.Duration
		tokens  int
	}{
		{"full duplex stream", full, sse, "200", sseBody, 2 * s, s, 2 * s, 5},
		{"full duplex json", full, json, "200", jsonBody, 2 * s, 0, 2 * s, 7},
		{"streamed stream", streamed, sse, "200", sseBody, 2 * s, s, 2 * s, 5},
		{"stream without usage", full, sse, "200", [][]byte{sseBody[0], sseBody[0], []byte("data: [DONE]\n\n")}, 2 * s, s, 2 * s, 2},
		{"buffered stream", buffered, sse, "200", [][]byte{append(append([]byte{}, sseBody[0]...), sseBody[1]...)}, 2 * s, 0, 2 * s, 5},
		{"buffered json", buffered, json, "200", jsonBody, 2 * s, 0, 2 * s, 7},
		{"none json", none, json, "200", nil, 2 * s, 0, 2 * s, 0},
		{"none stream", none, sse, "200", nil, 0, 0, 0, 0},
		{"4xx", full, json, "400", jsonBody, 2 * s, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder("10.1.2.3:8000")
			clk := &fakeClock{step: time.Second}
			h := startPicker(t, rec, Options{Clock: clk.Now})
			e := h.open(t)
			m := reqHeaders(false, nil, ":method", "POST", ":path", "/v1/chat/completions")
			m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: full, ResponseBodyMode: tc.mode}
			e.send(m)
			e.send(reqBody(chat("s", "s", "q"), true))
			e.readRouted()
			e.send(respHeaders(tc.mode == none, ":status", tc.status, "content-type", tc.ct))
			e.recv()
			for i, c := range tc.body {
				e.send(respBody(c, i == len(tc.body)-1))
				e.recv()
			}
			o := rec.waitDone(t)
			if o.Err != nil || o.Latency != tc.latency || o.TTFT != tc.ttft || o.Elapsed != tc.elapsed || o.OutputTokens != tc.tokens {
				t.Fatalf("outcome %+v; want latency %v, TTFT %v, elapsed %v, %d tokens", o, tc.latency, tc.ttft, tc.elapsed, tc.tokens)
			}
		})
	}
}
