package httpgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/budget"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/keys"
)

// Pass-through endpoints: requests the gateway forwards to one replica of
// the model they name, chosen for its load alone (they leave nothing in a
// prefix cache that a later request could reuse, so they have no prefix
// key and leave the index untouched), with the body forwarded byte for
// byte and the answer relayed as it arrives.
const (
	pathEmbeddings = "/v1/embeddings"
	pathTokenize   = "/tokenize"
	pathDetokenize = "/detokenize"
)

// passEndpoints maps each pass-through path to its endpoint label in
// exa_gateway_requests_total.
var passEndpoints = map[string]string{
	pathEmbeddings: "embeddings",
	pathTokenize:   "tokenize",
	pathDetokenize: "detokenize",
}

// passCall is one pass-through request.
type passCall struct {
	w        http.ResponseWriter
	r        *http.Request
	endpoint string // the metric's endpoint label
	model    string
	code     string
}

func (pc *passCall) fail(status int, typ, code, param, msg string) {
	pc.code = strconv.Itoa(status)
	front.WriteError(pc.w, status, typ, code, param, msg)
}

// servePassThrough handles POST /v1/embeddings, /tokenize and /detokenize.
func (s *Server) servePassThrough(w http.ResponseWriter, r *http.Request) {
	pc := &passCall{w: w, r: r, endpoint: passEndpoints[r.URL.Path]}
	s.metrics.InFlight.Inc()
	defer func() {
		s.metrics.InFlight.Dec()
		s.metrics.Requests.WithLabelValues(pc.model, pc.endpoint, pc.code).Inc()
	}()
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		pc.fail(http.StatusMethodNotAllowed, front.TypeInvalidRequest, "method_not_allowed", "", "gateway: "+r.URL.Path+" accepts POST only, not "+r.Method)
		return
	}
	if s.refused(w, r, pc.fail) {
		return
	}
	var in budget.Hold
	defer s.releaseBody(&in)
	body, ok := s.readRequest(w, r, &in, pc.fail)
	if !ok {
		return
	}
	st := s.Snapshot()
	name, body, err := passModel(st, body, &in)
	if errors.Is(err, budget.ErrSpent) {
		s.bodiesOverBudget(w, pc.fail, err)
		return
	}
	if err != nil {
		pc.fail(http.StatusBadRequest, front.TypeInvalidRequest, "invalid_request", front.Param(err), err.Error())
		return
	}
	ms, ok := st.Models[name]
	target := gateway.Target{NoPrompt: true}
	if !ok {
		rt, err := st.AdapterRoute(name)
		if err != nil {
			pc.fail(http.StatusNotFound, front.TypeNotFound, "model_not_found", "model", err.Error())
			return
		}
		ms = rt.Model
		// An adapter goes to the replicas whose engines serve it, its
		// name the library's to see, as the picker routes it.
		target.Adapter = rt.Name
		if eligible := rt.Eligible; eligible != nil {
			target.Allow = func(name string) bool { return eligible[name] }
		}
	}
	pc.model = ms.Name
	if ms.NoReplicas || len(ms.Order) == 0 {
		pc.fail(http.StatusServiceUnavailable, front.TypeUnavailable, "no_replicas", "model",
			fmt.Sprintf("%v: model %q has no replicas configured", ErrNoReplicas, ms.Name))
		return
	}
	if s.saturated(w, ms, target) {
		pc.code = front.CodeShed429
		return
	}
	s.passForward(pc, ms, target, body)
}

// passModel returns the model a pass-through body names and the body to
// forward. A body without "model" (or with null), when the gateway serves
// exactly one model, names that one; the body forwarded then names it
// too (see withSoleModel), charged to the request's share h of
// MaxRequestBytes (past it the error wraps budget.ErrSpent).
func passModel(st *fleet.State, body []byte, h *budget.Hold) (string, []byte, error) {
	req, err := front.DecodeEmbeddings(body)
	if err != nil {
		var re *front.RequestError
		if errors.As(err, &re) {
			return "", nil, err
		}
		return "", nil, fmt.Errorf("%w: body is not a valid JSON request: %v", ErrBadRequest, err)
	}
	if !req.HasModel {
		return withSoleModel(st, body, h, 1)
	}
	if req.Model == "" {
		return "", nil, front.FieldError("model", "field \"model\" is empty")
	}
	return req.Model, body, nil
}

// defaultModel is parseRequest's second chance for a chat or completions
// body without "model" (or with null): when the gateway serves exactly
// one model, the body names it (withSoleModel, the new body and its
// parse charged to h) and is parsed again. err is front.Parse's error;
// any other error is returned as is.
func defaultModel(st *fleet.State, kind keys.Endpoint, body []byte, err error, h *budget.Hold) (*keys.Request, []byte, error) {
	if front.Param(err) != "model" {
		return nil, nil, err
	}
	if d, derr := front.Decode(body); derr != nil || d.HasModel {
		return nil, nil, err
	}
	_, nb, serr := withSoleModel(st, body, h, 2)
	if serr != nil {
		return nil, nil, serr
	}
	req, err := front.Parse(kind, nb)
	if err != nil {
		return nil, nil, err
	}
	return req, nb, nil
}

// passForward sends the call to the replica of ms the routing library
// chooses for a request without a prompt (target, gateway.Target.NoPrompt:
// by load alone, counted in flight with the model's other requests; for an
// adapter, among the replicas serving it) and relays its answer, retrying
// once on another replica when the first fails before answering (a
// transport error, a 5xx or the response timeout).
func (s *Server) passForward(pc *passCall, ms *fleet.Model, target gateway.Target, body []byte) {
	var failed string
	var lastErr error
	for try := 0; try < 2; try++ {
		target.Exclude = failed
		d, ep := passPick(s.Snapshot(), ms, target)
		if ep == nil {
			if try > 0 {
				status, code := failStatus(lastErr)
				pc.fail(status, front.TypeServer, code, "",
					fmt.Sprintf("%v: model %q: %v; no other healthy replica to retry on", ErrUpstream, ms.Name, lastErr))
				return
			}
			pc.fail(http.StatusServiceUnavailable, front.TypeUnavailable, "no_healthy_replica", "",
				fmt.Sprintf("gateway: no healthy replica for model %q", ms.Name))
			return
		}
		retry, err := s.passSend(pc, d, ep, body, try == 0)
		if !retry {
			return
		}
		failed, lastErr = d.Replica, err
	}
}

// passPick routes a pass-through request of ms by the library to target
// (gateway.Target.NoPrompt, leaving out the replica that failed); the
// engine is nil when no replica is eligible. For a disaggregated model it
// is the decode pool's gateway that routes.
func passPick(st *fleet.State, ms *fleet.Model, target gateway.Target) (gateway.Decision, *fleet.Endpoint) {
	if ms.Gateway == nil {
		return gateway.Decision{}, nil
	}
	d, err := ms.Gateway.RouteWith(nil, target)
	if err != nil {
		return gateway.Decision{}, nil
	}
	ep := front.EndpointOf(st, ms, &d)
	if ep == nil { // removed by a reload since the snapshot was read
		d.Done(gateway.DoneInfo{})
		return gateway.Decision{}, nil
	}
	return d, ep
}

// passSend forwards the call to ep, the engine of decision d, which it
// completes (with no latency: a pass-through request's says nothing of
// a prompt's). Options.ResponseTimeout bounds the answer as a whole, as
// a non-streamed inference answer's (an SSE answer only until its head).
// It returns retry=true, with the
// cause, when ep failed before answering (its time included) and
// canRetry allows another try; otherwise it has answered the client.
func (s *Server) passSend(pc *passCall, d gateway.Decision, ep *fleet.Endpoint, body []byte, canRetry bool) (bool, error) {
	defer d.Done(gateway.DoneInfo{})
	ctx, cancel := context.WithCancel(pc.r.Context())
	defer cancel()
	timeout, timedOut, stop := max(s.opts.ResponseTimeout, 0), (*atomic.Bool)(nil), noTimer
	if timeout > 0 {
		timedOut, stop = s.startTimer(timeout, cancel)
	}
	defer stop()
	out, err := upstreamRequest(ctx, ep, pc.r.URL, body)
	if err != nil {
		pc.fail(http.StatusBadGateway, front.TypeServer, "bad_upstream_address", "", fmt.Sprintf("%v: %s: %v", ErrUpstream, ep.Base, err))
		return false, nil
	}
	if pc.r.Method != http.MethodPost { // a stored response's GET or DELETE (stored.go)
		out.Method = pc.r.Method
		if len(body) == 0 {
			out.Body, out.GetBody = http.NoBody, nil
		}
	}
	copyHeaders(out.Header, pc.r.Header)
	out.Header.Del("Expect")
	resp, err := s.opts.Transport.RoundTrip(out)
	if err == nil && resp.StatusCode < 200 {
		resp.Body.Close()
		err = fmt.Errorf("%w: status %d", errUpstreamInterim, resp.StatusCode)
	}
	if err != nil {
		if pc.r.Context().Err() != nil {
			pc.code = front.CodeClientCanceled
			return false, nil
		}
		s.Observe(ep, ep.Health.Failure(isDialError(err)))
		if timedOut != nil && timedOut.Load() {
			err = fmt.Errorf("%w (%v)", errResponseTimeout, timeout)
		}
		err = fmt.Errorf("engine %s: %w", ep.Base, err)
		if canRetry {
			return true, err
		}
		status, code := failStatus(err)
		pc.fail(status, front.TypeServer, code, "", fmt.Sprintf("%v: %v", ErrUpstream, err))
		return false, nil
	}
	defer resp.Body.Close()
	if isEventStream(resp) {
		stop() // a stream (a stored response retrieved with stream=true) is not bounded as a whole
	}
	if resp.StatusCode >= 500 {
		s.Observe(ep, ep.Health.Failure(false))
		if canRetry {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			return true, fmt.Errorf("engine %s: %w: status %d", ep.Base, errUpstreamStatus, resp.StatusCode)
		}
	} else {
		s.Observe(ep, ep.Health.Success(false))
	}
	h := pc.w.Header()
	s.copyAnswerHeaders(h, resp.Header)
	h.Set(HeaderReplica, d.Replica)
	pc.w.WriteHeader(resp.StatusCode)
	pc.code = strconv.Itoa(resp.StatusCode)
	bp := s.bufPool.Get().(*[]byte)
	defer s.bufPool.Put(bp)
	cw := &clientWriter{w: pc.w}
	if _, err := io.CopyBuffer(cw, resp.Body, *bp); err != nil {
		if cw.err != nil || pc.r.Context().Err() != nil {
			// The client is gone (a write to it failed, which may come
			// before its context ends): not the engine's failure.
			pc.code = front.CodeClientCanceled
			return false, nil
		}
		// A body cannot carry an error once begun: pass on what was
		// written and cut the connection (see failMidAnswer).
		s.Observe(ep, ep.Health.Failure(false))
		_ = http.NewResponseController(pc.w).Flush()
		pc.code = front.CodeAborted
		panic(http.ErrAbortHandler)
	}
	return false, nil
}

// clientWriter hides a ResponseWriter's ReadFrom, so that io.CopyBuffer
// uses the pooled buffer, and keeps the error of a write to the client,
// so that a client gone is told from an engine that failed.
type clientWriter struct {
	w   io.Writer
	err error
}

func (c *clientWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if err != nil {
		c.err = err
	}
	return n, err
}

// withSoleModel returns the one model the gateway serves and body with
// "model" set to it, appended as the object's last member, so that it
// wins over an earlier "model": null for the engine (Python's json keeps
// the last of repeated members) as for the gateway. Without exactly one
// model it is the error a missing "model" gets. body is one JSON object
// (decodeRequest checked it). The new body is charged, charge times its
// capacity (2 when it is parsed again), to the request's share h of
// MaxRequestBytes before it is made; past it the error wraps
// budget.ErrSpent.
func withSoleModel(st *fleet.State, body []byte, h *budget.Hold, charge int64) (string, []byte, error) {
	if len(st.Models) != 1 {
		return "", nil, front.FieldError("model", fmt.Sprintf("field \"model\" is required (the gateway serves %d models; it may be left out only when it serves one)", len(st.Models)))
	}
	var name string
	for n := range st.Models {
		name = n
	}
	b := bytes.TrimRight(body, " \t\r\n")
	if len(b) == 0 || b[len(b)-1] != '}' {
		return "", nil, fmt.Errorf("%w: body is not a JSON object", ErrBadRequest)
	}
	inner := bytes.TrimRight(b[:len(b)-1], " \t\r\n")
	q, err := json.Marshal(name)
	if err != nil {
		return "", nil, fmt.Errorf("%w: model name %q: %v", ErrBadRequest, name, err)
	}
	n := len(b) + len(q) + 12
	if err := h.Need(h.Held() + charge*int64(n)); err != nil {
		return "", nil, err
	}
	out := make([]byte, 0, n)
	out = append(out, inner...)
	if len(inner) > 0 && inner[len(inner)-1] != '{' {
		out = append(out, ',')
	}
	out = append(out, `"model":`...)
	out = append(out, q...)
	out = append(out, '}')
	return name, out, nil
}
