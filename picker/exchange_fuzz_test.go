package picker

import (
	"context"
	"encoding/binary"
	"io"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// memStream is an ext_proc stream in memory: Recv returns msgs in turn,
// then io.EOF; Send records.
type memStream struct {
	ctx  context.Context
	msgs []*extprocv3.ProcessingRequest
	sent []*extprocv3.ProcessingResponse
}

func (m *memStream) Context() context.Context { return m.ctx }
func (m *memStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(m.msgs) == 0 {
		return nil, io.EOF
	}
	r := m.msgs[0]
	m.msgs = m.msgs[1:]
	return r, nil
}
func (m *memStream) Send(r *extprocv3.ProcessingResponse) error {
	m.sent = append(m.sent, r)
	return nil
}

// countTracker counts its calls.
type countTracker struct{ first, done int }

func (c *countTracker) FirstToken()  { c.first++ }
func (c *countTracker) Done(Outcome) { c.done++ }

type countRouter struct{ trackers []*countTracker }

func (r *countRouter) Pick(_ context.Context, req *PickRequest) (Pick, error) {
	if len(req.Body) > 0 && req.Body[0] == '!' {
		return Pick{}, ErrShed
	}
	t := &countTracker{}
	r.trackers = append(r.trackers, t)
	ep := "10.0.0.1:80"
	if len(req.Body) > 0 && req.Body[0] == '?' {
		ep = "not an endpoint"
	}
	// A body of a JSON object may be streamed from the engine and
	// assembled (upstream.go), as chat or completions by its length.
	a := AssembleNone
	if len(req.Body) > 0 && req.Body[0] == '{' {
		a = AssembleChat + Assembly(len(req.Body)%2)
	}
	return Pick{Endpoint: ep, Fallbacks: []string{"10.0.0.2:80", "bad", "10.0.0.1:80"}, Tracker: t, Assemble: a}, nil
}

// encodeMsgs frames messages for FuzzExchange: a 2-byte length, then the
// message.
func encodeMsgs(tb testing.TB, ms ...*extprocv3.ProcessingRequest) []byte {
	var out []byte
	for _, m := range ms {
		b, err := proto.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		out = binary.BigEndian.AppendUint16(out, uint16(len(b)))
		out = append(out, b...)
	}
	return out
}

// FuzzExchange serves arbitrary message sequences, decoded from framed
// protobuf bytes: the server never panics, sends at most what the
// sequence calls for, and every picked request's Tracker hears Done
// exactly once and FirstToken at most once, however the sequence goes.
func FuzzExchange(f *testing.F) {
	body := chat("s", "s", "q")
	full := []*extprocv3.ProcessingRequest{reqHeaders(false, subsetMD(f, []any{"10.0.0.1:80", "10.0.0.2:80"})),
		reqBody(body[:10], false), reqBody(body[10:], true),
		respHeaders(false, ":status", "200", "content-type", "text/event-stream"),
		respBody([]byte("data: x\n\n"), false), respBody(nil, true)}
	f.Add(encodeMsgs(f, full...))
	f.Add(encodeMsgs(f, full[:4]...))
	f.Add(encodeMsgs(f, reqHeaders(true, nil), respHeaders(true, ":status", "503")))
	f.Add(encodeMsgs(f, reqHeaders(false, nil), reqBody(body, false), &extprocRequestTrailers,
		respHeaders(false, ":status", "200"), respBody([]byte("{}"), false),
		&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}))
	f.Add(encodeMsgs(f, reqHeaders(false, subsetMD(f, "")), reqBody(body, true)))
	withSource := reqHeaders(false, nil)
	withSource.Attributes = map[string]*structpb.Struct{extProcFilter: {Fields: map[string]*structpb.Value{SourceAttribute: structpb.NewStringValue("192.0.2.1:80")}}}
	f.Add(encodeMsgs(f, withSource, reqBody(body, true)))
	f.Add(encodeMsgs(f, reqHeaders(false, nil), reqBody([]byte("!shed"), true)))
	f.Add(encodeMsgs(f, reqHeaders(false, nil), reqBody([]byte("?"), true)))
	f.Add(encodeMsgs(f, &extprocv3.ProcessingRequest{ProtocolConfig: &extprocv3.ProtocolConfiguration{
		RequestBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: extprocfilterv3.ProcessingMode_NONE},
		Request: reqHeaders(true, nil).Request}, respHeaders(false, ":status", "200")))
	f.Add(encodeMsgs(f, reqBody(body, true), &extprocv3.ProcessingRequest{}))
	f.Add(encodeMsgs(f, reqHeaders(false, nil), reqBody(body, true),
		respHeaders(false, ":status", "200", "content-type", "text/event-stream"),
		respBody([]byte(`data: {"choices":[{"index":0,"delta":{"content":"a"}}]}`+"\n\n"), false),
		respBody([]byte("data: [DONE]\n\n"), true)))
	f.Fuzz(func(t *testing.T, data []byte) {
		var msgs []*extprocv3.ProcessingRequest
		for len(data) >= 2 {
			n := int(binary.BigEndian.Uint16(data))
			data = data[2:]
			if n > len(data) {
				n = len(data)
			}
			m := &extprocv3.ProcessingRequest{}
			if proto.Unmarshal(data[:n], m) == nil {
				msgs = append(msgs, m)
			}
			data = data[n:]
		}
		r := &countRouter{}
		s, err := New(r, Options{MaxBodyBytes: 4096, MaxFallbacks: 2})
		if err != nil {
			t.Fatal(err)
		}
		st := &memStream{ctx: context.Background(), msgs: msgs}
		_ = s.serve(st)
		if len(r.trackers) > 1 {
			t.Fatalf("%d picks on one stream", len(r.trackers))
		}
		if st := s.Stats(); st.ReservedBytes != 0 || st.AssembledBytes != 0 || st.BufferedBytes != 0 {
			t.Fatalf("the stream ended holding %d bytes (%d assembled, %d buffered)", st.ReservedBytes, st.AssembledBytes, st.BufferedBytes)
		}
		for _, tr := range r.trackers {
			if tr.done != 1 || tr.first > 1 {
				t.Fatalf("tracker heard Done %d times, FirstToken %d times", tr.done, tr.first)
			}
		}
		// Each message gets its answers; at most the body cut in chunks.
		if limit := 3*len(msgs) + 4096/MaxChunkBytes + 2; len(st.sent) > limit {
			t.Fatalf("%d answers to %d messages", len(st.sent), len(msgs))
		}
	})
}
