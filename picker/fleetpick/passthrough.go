package fleetpick

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/picker"
)

// passEndpoints are the endpoint labels, in the request counter, of the
// pass-through paths (as the HTTP gateway's).
var passEndpoints = map[string]string{"/v1/embeddings": "embeddings", "/tokenize": "tokenize", "/detokenize": "detokenize"}

// passThrough picks for POST /v1/embeddings, /tokenize and /detokenize as
// the HTTP gateway routes them: a replica of the model the body names
// (front.DecodeEmbeddings; a LoRA adapter's, among the replicas serving
// it), chosen by the library for a request without a prompt
// (gateway.Target.NoPrompt: by load alone), within the subset hint, with
// the fallbacks asked for. The body must name its model (the picker
// cannot add one to it, as the HTTP gateway does when it serves one
// model). Admission sheds them as inference requests (429), by the
// library's rule for a request without a prompt.
func (r *Router) passThrough(req *picker.PickRequest, path string, start time.Time) (picker.Pick, error) {
	pr := pickRequest{r: r, kind: keys.Chat, start: start, fallback: -1}
	endpoint := passEndpoints[path]
	fail := func(status int, typ, code, param string, err error) (picker.Pick, error) {
		model := ""
		if pr.ms != nil {
			model = pr.ms.Name
		}
		se := &picker.StatusError{Status: status, Type: typ, Code: code, Param: param, Err: err}
		if status == http.StatusMethodNotAllowed {
			se.Allow = http.MethodPost
		}
		return pr.passFail(model, endpoint, se)
	}
	if req.Method != http.MethodPost {
		return fail(http.StatusMethodNotAllowed, front.TypeInvalidRequest, "method_not_allowed", "", errors.New("gateway: "+path+" accepts POST only, not "+req.Method))
	}
	rq, err := front.DecodeEmbeddings(req.Body)
	switch {
	case err != nil && front.Param(err) == "":
		err = fmt.Errorf("%w: %w: body is not a valid JSON request: %w", picker.ErrBadRequest, front.ErrBadRequest, err)
	case err != nil:
		err = fmt.Errorf("%w: %w", picker.ErrBadRequest, err)
	case !rq.HasModel || rq.Model == "":
		err = fmt.Errorf("%w: %w", picker.ErrBadRequest, front.FieldError("model", "field \"model\" is required"))
	}
	if err != nil {
		return fail(http.StatusBadRequest, front.TypeInvalidRequest, "invalid_request", front.Param(err), err)
	}
	st := r.fl.Snapshot()
	ms, ok := st.Models[rq.Model]
	if !ok {
		if pr.lora, err = st.AdapterRoute(rq.Model); err != nil {
			return fail(http.StatusNotFound, front.TypeNotFound, "model_not_found", "model", fmt.Errorf("%w: %w", picker.ErrUnknownModel, err))
		}
		ms = pr.lora.Model
	}
	pr.ms = ms
	if ms.NoReplicas || ms.Gateway == nil {
		return fail(http.StatusServiceUnavailable, front.TypeUnavailable, "no_replicas", "model",
			fmt.Errorf("%w: %w: model %q has no replicas configured", picker.ErrNoEndpoint, front.ErrNoReplicas, ms.Name))
	}
	pr.tab, pr.sub = r.tableOf(st), req.Subset
	allow := pr.allow(false)
	if a, t := r.opts.Admission, pr.target(allow); ms.Gateway.Saturated(gateway.Target{Adapter: t.Adapter, Allow: t.Allow, NoPrompt: true}, a) {
		// Shed by the library's rule, as the HTTP gateway sheds them,
		// and counted as shed (reason="shed").
		r.metrics.Requests.WithLabelValues(ms.Name, endpoint, front.CodeShed429).Inc()
		return picker.Pick{}, &picker.StatusError{Status: http.StatusTooManyRequests, Type: front.TypeRateLimit, Code: front.CodeShed,
			RetryAfter: r.retryAfter(http.StatusTooManyRequests), Err: fmt.Errorf("%w: gateway: model %q is saturated: no eligible replica has room (%s)", picker.ErrShed, ms.Name, front.AdmissionText(a))}
	}
	for try, failed := 0, ""; try < 2; try++ {
		t := pr.target(allow)
		t.NoPrompt, t.Exclude = true, failed
		d, err := ms.Gateway.RouteWith(nil, t)
		if err != nil {
			if errors.Is(err, gateway.ErrNoHealthyReplica) {
				return fail(http.StatusServiceUnavailable, front.TypeUnavailable, "no_healthy_replica", "",
					fmt.Errorf("%w: gateway: no healthy replica for model %q: %w", picker.ErrNoEndpoint, ms.Name, err))
			}
			return fail(http.StatusInternalServerError, front.TypeServer, "routing_error", "", err)
		}
		ep, addr, err := pr.endpoint(&d)
		if err != nil { // a reload moved the replica: try another
			d.Done(gateway.DoneInfo{Err: err})
			failed = d.Replica
			continue
		}
		tr := pr.trackPass(d, ep, addr, endpoint)
		return picker.Pick{Endpoint: addr, Fallbacks: pr.fallbacks(allow, d.Replica), ResponseHeaders: []picker.Header{{Name: front.HeaderReplica, Value: d.Replica}}, Tracker: tr}, nil
	}
	return fail(http.StatusServiceUnavailable, front.TypeUnavailable, "no_healthy_replica", "", fmt.Errorf("%w: gateway: no replica of model %q is configured", picker.ErrNoEndpoint, ms.Name))
}

// trackPass returns the Tracker of a request without a prompt, counted
// under its endpoint label (tracker.pass), its decision not counted (as
// in the HTTP gateway: it places no prompt).
func (pr *pickRequest) trackPass(d gateway.Decision, ep *fleet.Endpoint, endpoint, label string) *tracker {
	r := pr.r
	r.metrics.InFlight.Inc()
	t := r.pool.Get().(*tracker)
	*t = tracker{r: r, ms: pr.ms, kind: pr.kind, start: pr.start, d: d, ep: ep, endpoint: endpoint, tab: pr.tab, pass: label, head: t.head}
	return t
}
