package httpgw

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
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

// passLoad counts the pass-through requests in flight at each engine
// (the gateway's own view, fresher than a scrape), and turns the start of
// the candidate list so that equally loaded replicas take turns. Safe for
// concurrent use; the zero value is empty.
type passLoad struct {
	turn atomic.Uint64
	mu   sync.Mutex
	// inFlight is keyed by engine address; an entry is deleted when its
	// count returns to zero, so it holds at most one entry per engine
	// with requests in flight.
	inFlight map[string]int
}

func (p *passLoad) add(addr string, d int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight == nil {
		p.inFlight = map[string]int{}
	}
	n := p.inFlight[addr] + d
	if n <= 0 {
		delete(p.inFlight, addr)
		return
	}
	p.inFlight[addr] = n
}

func (p *passLoad) get(addr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inFlight[addr]
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
	body, err := readBody(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes), r.ContentLength, s.opts.MaxBodyBytes)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			pc.fail(http.StatusRequestEntityTooLarge, front.TypeInvalidRequest, "request_too_large", "",
				fmt.Sprintf("%v: the body exceeds %d bytes", ErrBodyTooLarge, mbe.Limit))
			return
		}
		pc.fail(http.StatusBadRequest, front.TypeInvalidRequest, "invalid_body", "", fmt.Sprintf("%v: reading the body: %v", ErrBadRequest, err))
		return
	}
	st := s.Snapshot()
	name, body, err := passModel(st, body)
	if err != nil {
		pc.fail(http.StatusBadRequest, front.TypeInvalidRequest, "invalid_request", front.Param(err), err.Error())
		return
	}
	ms, ok := st.Models[name]
	if !ok {
		rt, err := st.AdapterRoute(name)
		if err != nil {
			pc.fail(http.StatusNotFound, front.TypeNotFound, "model_not_found", "model", err.Error())
			return
		}
		ms = rt.Model
	}
	pc.model = ms.Name
	if ms.NoReplicas || len(ms.Order) == 0 {
		pc.fail(http.StatusServiceUnavailable, front.TypeUnavailable, "no_replicas", "model",
			fmt.Sprintf("%v: model %q has no replicas configured", ErrNoReplicas, ms.Name))
		return
	}
	s.passForward(pc, ms, body)
}

// passModel returns the model a pass-through body names and the body to
// forward. A body without "model" (or with null), when the gateway serves
// exactly one model, names that one; the body forwarded then names it
// too (see withSoleModel).
func passModel(st *fleet.State, body []byte) (string, []byte, error) {
	req, err := front.Decode(body)
	if err != nil {
		var re *front.RequestError
		if errors.As(err, &re) {
			return "", nil, err
		}
		return "", nil, fmt.Errorf("%w: body is not a valid JSON request: %v", ErrBadRequest, err)
	}
	if !req.HasModel {
		return withSoleModel(st, body)
	}
	if req.Model == "" {
		return "", nil, front.FieldError("model", "field \"model\" is empty")
	}
	return req.Model, body, nil
}

// defaultModel is parseRequest's second chance for a chat or completions
// body without "model" (or with null): when the gateway serves exactly
// one model, the body names it (withSoleModel) and is parsed again. err
// is front.Parse's error; any other error is returned as is.
func defaultModel(st *fleet.State, kind keys.Endpoint, body []byte, err error) (*keys.Request, []byte, error) {
	if front.Param(err) != "model" {
		return nil, nil, err
	}
	if d, derr := front.Decode(body); derr != nil || d.HasModel {
		return nil, nil, err
	}
	_, nb, serr := withSoleModel(st, body)
	if serr != nil {
		return nil, nil, serr
	}
	req, err := front.Parse(kind, nb)
	if err != nil {
		return nil, nil, err
	}
	return req, nb, nil
}

// passForward sends the call to the least loaded healthy replica of ms and
// relays its answer, retrying once on another replica when the first
// fails before answering (a transport error or a 5xx).
func (s *Server) passForward(pc *passCall, ms *fleet.Model, body []byte) {
	var failed *fleet.Endpoint
	var lastErr error
	for try := 0; try < 2; try++ {
		ep := s.passPick(ms, failed)
		if ep == nil {
			if try > 0 {
				pc.fail(http.StatusBadGateway, front.TypeServer, "upstream_error", "",
					fmt.Sprintf("%v: model %q: %v; no other healthy replica to retry on", ErrUpstream, ms.Name, lastErr))
				return
			}
			pc.fail(http.StatusServiceUnavailable, front.TypeUnavailable, "no_healthy_replica", "",
				fmt.Sprintf("gateway: no healthy replica for model %q", ms.Name))
			return
		}
		retry, err := s.passSend(pc, ep, body, try == 0)
		if !retry {
			return
		}
		failed, lastErr = ep, err
	}
}

// passSend forwards the call to ep. It returns retry=true, with the cause,
// when ep failed before answering and canRetry allows another try;
// otherwise it has answered the client.
func (s *Server) passSend(pc *passCall, ep *fleet.Endpoint, body []byte, canRetry bool) (bool, error) {
	s.pass.add(ep.Base, 1)
	defer s.pass.add(ep.Base, -1)
	out, err := upstreamRequest(pc.r.Context(), ep, pc.r.URL, body)
	if err != nil {
		pc.fail(http.StatusBadGateway, front.TypeServer, "bad_upstream_address", "", fmt.Sprintf("%v: %s: %v", ErrUpstream, ep.Base, err))
		return false, nil
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
		err = fmt.Errorf("engine %s: %w", ep.Base, err)
		if canRetry {
			return true, err
		}
		pc.fail(http.StatusBadGateway, front.TypeServer, "upstream_error", "", fmt.Sprintf("%v: %v", ErrUpstream, err))
		return false, nil
	}
	defer resp.Body.Close()
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
	copyHeaders(h, resp.Header)
	h.Set(HeaderReplica, s.replicaName(ep, pc.model))
	pc.w.WriteHeader(resp.StatusCode)
	pc.code = strconv.Itoa(resp.StatusCode)
	bp := s.bufPool.Get().(*[]byte)
	defer s.bufPool.Put(bp)
	if _, err := io.CopyBuffer(writerOnly{pc.w}, resp.Body, *bp); err != nil {
		if pc.r.Context().Err() != nil {
			pc.code = front.CodeClientCanceled
			return false, nil
		}
		// A body cannot carry an error once begun: cut the connection
		// (see failMidAnswer).
		pc.code = front.CodeAborted
		panic(http.ErrAbortHandler)
	}
	return false, nil
}

// writerOnly hides a ResponseWriter's ReadFrom, so that io.CopyBuffer
// uses the pooled buffer.
type writerOnly struct{ io.Writer }

// replicaName returns the name model gives the engine ep ("" if none).
func (s *Server) replicaName(ep *fleet.Endpoint, model string) string {
	if ms := s.Snapshot().Models[model]; ms != nil {
		for _, name := range ms.Order {
			if ms.ByName[name] == ep {
				return name
			}
		}
	}
	return ""
}

// passPick returns the least loaded healthy replica of ms other than
// skip, by the routing library's load-aware policy (gateway.LoadAware with
// the model's load weights) over the engines' scraped load and the
// gateway's pass-through requests in flight; nil when there is none.
// Equal scores are drawn from a count of pass-through requests
// (gateway.Request.Tie), as the gateway draws its own ties.
func (s *Server) passPick(ms *fleet.Model, skip *fleet.Endpoint) *fleet.Endpoint {
	n := len(ms.Order)
	cands := make([]gateway.Candidate, 0, n)
	eps := make([]*fleet.Endpoint, 0, n)
	turn := s.pass.turn.Add(1)
	start := int(turn % uint64(n))
	for i := range n {
		name := ms.Order[(start+i)%n]
		ep := ms.ByName[name]
		if ep == nil || ep == skip || !ep.Health.Healthy() {
			continue
		}
		l, _, _, _ := ep.SnapshotLoad()
		cands = append(cands, gateway.Candidate{Name: name, Load: l, InFlight: s.pass.get(ep.Base)})
		eps = append(eps, ep)
	}
	if len(cands) == 0 {
		return nil
	}
	var w gateway.LoadWeights
	if lw := ms.Cfg.LoadWeights; lw != nil {
		w = gateway.LoadWeights(*lw)
	}
	return eps[(&gateway.LoadAware{Weights: w}).Pick(&gateway.Request{Tie: turn}, cands)]
}

// withSoleModel returns the one model the gateway serves and body with
// "model" set to it, appended as the object's last member, so that it
// wins over an earlier "model": null for the engine (Python's json keeps
// the last of repeated members) as for the gateway. Without exactly one
// model it is the error a missing "model" gets. body is one JSON object
// (decodeRequest checked it).
func withSoleModel(st *fleet.State, body []byte) (string, []byte, error) {
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
	out := make([]byte, 0, len(b)+len(q)+12)
	out = append(out, inner...)
	if len(inner) > 0 && inner[len(inner)-1] != '{' {
		out = append(out, ',')
	}
	out = append(out, `"model":`...)
	out = append(out, q...)
	out = append(out, '}')
	return name, out, nil
}
