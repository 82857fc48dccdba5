package picker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/internal/sseagg"
	"github.com/examlops/gateway/keys"
)

// asmTracker records when it hears FirstToken: how many messages the
// stream had left to read then.
type asmTracker struct {
	st        *memStream
	firstLeft int // -1 before FirstToken
	done      []Outcome
}

func (a *asmTracker) FirstToken()    { a.firstLeft = len(a.st.msgs) }
func (a *asmTracker) Done(o Outcome) { a.done = append(a.done, o) }

// asmRouter picks one endpoint, allowing assembly as set, with an
// asmTracker.
type asmRouter struct {
	assemble Assembly
	st       *memStream
	tr       *asmTracker
	resp     []Header
	can      bool // the request's CanAssemble
}

func (r *asmRouter) Pick(_ context.Context, req *PickRequest) (Pick, error) {
	r.can = req.CanAssemble
	r.tr = &asmTracker{st: r.st, firstLeft: -1}
	return Pick{Endpoint: endpointN(0), Tracker: r.tr, Assemble: r.assemble, ResponseHeaders: r.resp}, nil
}

// sseChunks are an engine's stream of a chat answer, as vLLM sends it
// with stream_options.include_usage, cut as the network might.
var sseChunks = []string{
	`data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"m1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n",
	`data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"m1","choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]}` + "\n\ndata: {\"id\":\"c1\",\"object\":\"chat.com",
	`pletion.chunk","created":7,"model":"m1","choices":[{"index":0,"delta":{"content":"lo \u00e9"},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n",
	`data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"m1","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}` + "\n\n",
	"data: [DONE]\n\n",
}

// assembled is what the HTTP gateway's aggregator makes of chunks.
func assembled(t *testing.T, chat bool, chunks ...string) []byte {
	t.Helper()
	g := sseagg.New(chat, 32<<20, 8<<20)
	require.NoError(t, g.Feed([]byte(strings.Join(chunks, ""))))
	b, err := g.Answer()
	require.NoError(t, err)
	return b
}

// asmRun serves one exchange from memory: protocol configuration pc (nil:
// none), the request body, response headers of status and content type,
// then the body chunks, the last with end_of_stream.
type asmRun struct {
	pc          *extprocv3.ProtocolConfiguration
	body        string
	status      string
	contentType string
	chunks      []string
	opts        Options
	assemble    Assembly
	trailers    bool // the body ends with response trailers, not end_of_stream
}

type asmResult struct {
	srv    *Server
	r      *asmRouter
	sent   []*extprocv3.ProcessingResponse
	err    error
	toEng  []byte   // the request body streamed back to Envoy
	clen   string   // the request's content-length
	set    []Header // set on the response headers
	remove []string
	bodies [][]byte // the response body answers, in order
	eos    []bool
	imm    *extprocv3.ImmediateResponse
}

func (a asmRun) serve(t *testing.T) asmResult {
	t.Helper()
	st := &memStream{ctx: context.Background()}
	r := &asmRouter{assemble: a.assemble, st: st}
	s, err := New(r, a.opts)
	require.NoError(t, err)
	first := reqHeaders(false, nil)
	first.ProtocolConfig = a.pc
	st.msgs = []*extprocv3.ProcessingRequest{first, reqBody([]byte(a.body), true),
		respHeaders(len(a.chunks) == 0, ":status", a.status, "content-type", a.contentType)}
	for i, c := range a.chunks {
		st.msgs = append(st.msgs, respBody([]byte(c), i == len(a.chunks)-1 && !a.trailers))
	}
	if a.trailers {
		st.msgs = append(st.msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
	}
	res := asmResult{srv: s, r: r}
	res.err = s.serve(st)
	res.sent = st.sent
	for _, m := range st.sent {
		switch {
		case m.GetRequestHeaders() != nil:
			for _, o := range m.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
				if strings.EqualFold(o.GetHeader().GetKey(), "content-length") {
					res.clen = string(o.GetHeader().GetRawValue())
				}
			}
		case m.GetRequestBody() != nil:
			res.toEng = append(res.toEng, m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		case m.GetResponseHeaders() != nil:
			mu := m.GetResponseHeaders().GetResponse().GetHeaderMutation()
			for _, o := range mu.GetSetHeaders() {
				res.set = append(res.set, Header{Name: o.GetHeader().GetKey(), Value: string(o.GetHeader().GetRawValue())})
			}
			res.remove = mu.GetRemoveHeaders()
		case m.GetResponseBody() != nil:
			sr := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			res.bodies = append(res.bodies, sr.GetBody())
			res.eos = append(res.eos, sr.GetEndOfStream())
		case m.GetImmediateResponse() != nil:
			res.imm = m.GetImmediateResponse()
		}
	}
	return res
}

var fullDuplex = &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	ResponseBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED}

const asmBody = `{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":false}`

// A request whose Pick allows assembly goes to the engine asking for a
// stream with usage; the engine's stream is answered with empty chunks
// while it comes, and the client gets the JSON answer the HTTP gateway's
// aggregator assembles from it, as application/json. The Tracker hears
// FirstToken at the stream's first chunk, with the rest still to come.
func TestUpstreamStreamAssembles(t *testing.T) {
	for _, pc := range []*extprocv3.ProtocolConfiguration{fullDuplex, nil} {
		now := time.Unix(1e9, 0)
		clock := func() time.Time { now = now.Add(time.Millisecond); return now } // one goroutine serves
		res := asmRun{pc: pc, body: asmBody, status: "200", contentType: "text/event-stream", chunks: sseChunks, assemble: AssembleChat,
			opts: Options{Clock: clock}}.serve(t)
		require.NoError(t, res.err)
		require.Nil(t, res.imm)
		want := `{"model":"m1","messages":[{"role":"user","content":"hi"}],` + keys.StreamMembers + `}`
		assert.Equal(t, want, string(res.toEng), "the body sent to the engine")
		assert.Equal(t, fmt.Sprint(len(want)), res.clen, "content-length is the rewritten body's")
		assert.Contains(t, res.set, Header{Name: "content-type", Value: "application/json"})
		assert.Equal(t, []string{"content-length"}, res.remove)
		require.Len(t, res.bodies, len(sseChunks))
		for i := range len(sseChunks) - 1 {
			assert.Empty(t, res.bodies[i], "chunk %d held", i)
			assert.False(t, res.eos[i])
		}
		assert.True(t, res.eos[len(sseChunks)-1])
		got := res.bodies[len(sseChunks)-1]
		assert.Equal(t, string(assembled(t, true, sseChunks...)), string(got))
		var v map[string]any
		require.NoError(t, json.Unmarshal(got, &v), "%s", got)
		assert.Equal(t, "chat.completion", v["object"])
		assert.Equal(t, "Hello é", v["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"])
		assert.True(t, res.r.can, "the Router was told the answer would be assembled")
		tr := res.r.tr
		assert.Equal(t, len(sseChunks)-1, tr.firstLeft, "FirstToken at the first chunk, the rest still to read")
		require.Len(t, tr.done, 1)
		assert.NoError(t, tr.done[0].Err)
		assert.Equal(t, 200, tr.done[0].Status)
		assert.Equal(t, 2, tr.done[0].OutputTokens, "the stream's usage")
		assert.Positive(t, tr.done[0].TTFT, "the first chunk timed")
		assert.Greater(t, tr.done[0].Elapsed, tr.done[0].TTFT)
		st := res.srv.Stats()
		assert.Equal(t, uint64(1), st.UpstreamStreamed)
		assert.Zero(t, st.AssembledBytes, "the answer's share returned")
		assert.Zero(t, st.ReservedBytes, "every reservation returned")
	}
}

// A body that trailers end gets the assembled answer before the trailers'
// answer, without end_of_stream, as the picker answers a request body
// that trailers end.
func TestUpstreamStreamTrailers(t *testing.T) {
	res := asmRun{pc: fullDuplex, body: asmBody, status: "200", contentType: "text/event-stream", chunks: sseChunks, assemble: AssembleChat, trailers: true}.serve(t)
	require.NoError(t, res.err)
	require.Nil(t, res.imm)
	require.Len(t, res.bodies, len(sseChunks)+1, "an empty answer for each chunk, then the assembled answer")
	assert.Equal(t, string(assembled(t, true, sseChunks...)), string(res.bodies[len(sseChunks)]))
	assert.NotContains(t, res.eos, true, "no end_of_stream: the trailers end the body")
	last := res.sent[len(res.sent)-1]
	assert.NotNil(t, last.GetResponseTrailers(), "the trailers answered last")
	require.Len(t, res.r.tr.done, 1)
	assert.NoError(t, res.r.tr.done[0].Err)
	assert.Zero(t, res.srv.Stats().ReservedBytes)
}

// Pick.ResponseHeaders are kept on an assembled answer; a completions
// answer is assembled as one.
func TestUpstreamStreamCompletions(t *testing.T) {
	chunks := []string{
		`data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"a","finish_reason":null}]}` + "\n\n",
		`data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":"b","finish_reason":"length"}]}` + "\n\ndata: [DONE]\n\n",
	}
	a := asmRun{pc: fullDuplex, body: `{"model":"m1","prompt":"p"}`, status: "200", contentType: "text/event-stream; charset=utf-8", chunks: chunks, assemble: AssembleCompletions}
	res := a.serve(t)
	require.Nil(t, res.imm)
	assert.Equal(t, string(assembled(t, false, chunks...)), string(res.bodies[len(res.bodies)-1]))
	assert.Contains(t, string(res.bodies[len(res.bodies)-1]), `"text":"ab"`)
}

// The request goes as it is, and its answer too, when the Pick does not
// allow assembly, when it is off, when Envoy's response body mode is not
// FULL_DUPLEX_STREAMED (the picker cannot replace the body), and when
// MaxBufferedBytes cannot hold the answer's first step (the request is
// forwarded as it is rather than failed). The Router is told so
// beforehand (PickRequest.CanAssemble) in all but the first case.
func TestUpstreamStreamLeftAlone(t *testing.T) {
	mode := func(m extprocfilterv3.ProcessingMode_BodySendMode) *extprocv3.ProtocolConfiguration {
		return &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: m}
	}
	tight := Options{MaxBodyBytes: 1024, MaxBufferedBytes: 1024 + StreamBytes}
	for _, tc := range []struct {
		name     string
		run      asmRun
		skipped  uint64
		overload uint64
		can      bool // PickRequest.CanAssemble
	}{
		{name: "not allowed", run: asmRun{pc: fullDuplex}, can: true},
		{name: "disabled", run: asmRun{pc: fullDuplex, assemble: AssembleChat, opts: Options{DisableUpstreamStream: true}}},
		{name: "buffered", run: asmRun{pc: mode(extprocfilterv3.ProcessingMode_BUFFERED), assemble: AssembleChat}},
		{name: "streamed", run: asmRun{pc: mode(extprocfilterv3.ProcessingMode_STREAMED), assemble: AssembleChat}},
		{name: "buffered partial", run: asmRun{pc: mode(extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL), assemble: AssembleChat}},
		{name: "none", run: asmRun{pc: mode(extprocfilterv3.ProcessingMode_NONE), assemble: AssembleChat}},
		{name: "over budget", run: asmRun{pc: fullDuplex, assemble: AssembleChat, opts: tight}, skipped: 1, overload: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.run
			a.body, a.status, a.contentType, a.chunks = asmBody, "200", "text/event-stream", sseChunks
			if a.pc.GetResponseBodyMode() == extprocfilterv3.ProcessingMode_NONE {
				a.chunks = nil // no body comes to the picker
			}
			res := a.serve(t)
			require.NoError(t, res.err)
			assert.Equal(t, asmBody, string(res.toEng), "the body as the client sent it")
			assert.Equal(t, fmt.Sprint(len(asmBody)), res.clen)
			assert.Empty(t, res.set)
			assert.Nil(t, res.imm)
			if a.pc.GetResponseBodyMode() == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
				assert.Equal(t, strings.Join(sseChunks, ""), string(bytes.Join(res.bodies, nil)), "the stream echoed")
			}
			st := res.srv.Stats()
			assert.Equal(t, tc.can, res.r.can, "PickRequest.CanAssemble")
			assert.Zero(t, st.UpstreamStreamed)
			assert.Equal(t, tc.skipped, st.UpstreamStreamSkipped)
			assert.Equal(t, tc.overload, st.Overloaded)
			assert.Zero(t, st.ReservedBytes)
			require.Len(t, res.r.tr.done, 1)
			assert.NoError(t, res.r.tr.done[0].Err)
		})
	}
}

// A rewritten request whose answer is not a 2xx event stream (an error,
// an engine answering JSON whatever it is asked) has it passed to the
// client unchanged.
func TestUpstreamStreamPassesOtherAnswers(t *testing.T) {
	for _, tc := range []struct{ status, ct, body string }{
		{"400", "application/json", `{"error":{"message":"bad"}}`},
		{"500", "text/event-stream", "data: {}\n\n"},
		{"200", "application/json", `{"id":"x","choices":[]}`},
	} {
		res := asmRun{pc: fullDuplex, body: asmBody, status: tc.status, contentType: tc.ct, chunks: []string{tc.body}, assemble: AssembleChat}.serve(t)
		require.NoError(t, res.err)
		assert.Contains(t, string(res.toEng), keys.StreamMembers, "the request was rewritten")
		assert.Empty(t, res.set, tc.status)
		assert.Equal(t, tc.body, string(bytes.Join(res.bodies, nil)), tc.status)
		assert.Zero(t, res.srv.Stats().ReservedBytes)
		assert.Zero(t, res.srv.Stats().UpstreamStreamFailed)
	}
}

// A stream that cannot be assembled ends the request with an immediate
// response naming the cause (502, as the HTTP gateway answers; 503 for an
// answer past the budget), Done with the error, every reservation
// returned.
func TestUpstreamStreamFailures(t *testing.T) {
	first := sseChunks[0]
	big := `data: {"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 40<<10) + `"}}]}` + "\n\n"
	huge := `data: {"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 80<<10) + `"}}]}` + "\n\n"
	for _, tc := range []struct {
		name   string
		chunks []string
		opts   Options
		status int
		msg    string
	}{
		{name: "cut", chunks: []string{first, ""}, status: 502, msg: "ended before its data: [DONE]"},
		{name: "error event", chunks: []string{first, `data: {"error":{"message":"engine failed"}}` + "\n\n", "data: [DONE]\n\n"}, status: 502, msg: "error event"},
		{name: "malformed", chunks: []string{"data: {nope\n\n", "data: [DONE]\n\n"}, status: 502, msg: "assembled"},
		{name: "over budget", chunks: []string{first, huge, "data: [DONE]\n\n"}, opts: Options{MaxBodyBytes: 128 << 10, MaxBufferedBytes: 128<<10 + StreamBytes},
			status: 503, msg: "past the picker's budget"},
		{name: "over the answer's bound", chunks: []string{first, big, big, big, big, big, big, "data: [DONE]\n\n"}, opts: Options{MaxBodyBytes: 48 << 10},
			status: 502, msg: "assembled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := asmRun{pc: fullDuplex, body: asmBody, status: "200", contentType: "text/event-stream", chunks: tc.chunks, assemble: AssembleChat, opts: tc.opts}.serve(t)
			require.NoError(t, res.err)
			require.NotNil(t, res.imm, "an immediate response")
			assert.Equal(t, tc.status, int(res.imm.GetStatus().GetCode()))
			assert.Contains(t, string(res.imm.GetBody()), tc.msg)
			assert.Contains(t, string(res.imm.GetBody()), `"error"`)
			require.Len(t, res.r.tr.done, 1)
			assert.ErrorIs(t, res.r.tr.done[0].Err, errAssemble)
			for _, b := range res.bodies {
				assert.Empty(t, b, "nothing of the answer sent")
			}
			st := res.srv.Stats()
			assert.Equal(t, uint64(1), st.UpstreamStreamFailed)
			assert.Zero(t, st.ReservedBytes)
			assert.Zero(t, st.AssembledBytes)
		})
	}
}

// An answer longer than MaxChunkBytes goes back in chunks of at most
// MaxChunkBytes, end_of_stream on the last only.
func TestUpstreamStreamLongAnswer(t *testing.T) {
	var chunks []string
	for i := range 40 {
		chunks = append(chunks, fmt.Sprintf(`data: {"choices":[{"index":0,"delta":{"content":"%d%s"}}]}`+"\n\n", i, strings.Repeat("y", 5000)))
	}
	chunks = append(chunks, "data: [DONE]\n\n")
	res := asmRun{pc: fullDuplex, body: asmBody, status: "200", contentType: "text/event-stream", chunks: chunks, assemble: AssembleChat}.serve(t)
	require.Nil(t, res.imm)
	held := len(chunks) - 1
	var out []byte
	for i, b := range res.bodies[held:] {
		assert.LessOrEqual(t, len(b), MaxChunkBytes)
		assert.Equal(t, i == len(res.bodies)-held-1, res.eos[held+i])
		out = append(out, b...)
	}
	assert.Greater(t, len(res.bodies)-held, 3)
	want := assembled(t, true, chunks...)
	assert.Equal(t, len(want), len(out))
	assert.True(t, bytes.Equal(want, out), "the answer as assembled")
}
