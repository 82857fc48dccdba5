package httpgw

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/examlops/gateway/config"
)

// serveHealth serves GET /health as vLLM's does: 200 with an empty body
// while the gateway can serve, that is while some configured model has a
// healthy replica; otherwise 503 with an OpenAI error naming the cause.
// (/healthz stays the process's liveness: always 200.)
func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "", "gateway: /health accepts GET only")
		return
	}
	st := s.Snapshot()
	if len(st.Models) == 0 {
		writeError(w, http.StatusServiceUnavailable, typeUnavailable, "no_models", "", "gateway: no model configured")
		return
	}
	for _, m := range st.Models {
		for _, ep := range m.ByName {
			if ep.Health.Healthy() {
				w.WriteHeader(http.StatusOK)
				return
			}
		}
	}
	writeError(w, http.StatusServiceUnavailable, typeUnavailable, "no_healthy_replica", "", "gateway: no healthy replica of any model")
}

// forwardedFor is a request's X-Forwarded-For before appendForwardedFor
// edited it.
type forwardedFor struct {
	prior    []string
	had, set bool
}

// appendForwardedFor adds the client's address to the request's
// X-Forwarded-For (after any the client sent), so that the engines, which
// see the gateway's address as the peer, can log the client's; the proxy
// copies the request's headers to the engine's request. It edits the
// request's header map; ServeHTTP puts it back (restore) once the handler
// is done, so that a caller serving the same Request twice does not see
// it grow.
func appendForwardedFor(r *http.Request) forwardedFor {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil || host == "" {
		return forwardedFor{}
	}
	prior, had := r.Header["X-Forwarded-For"]
	v := host
	if len(prior) > 0 {
		v = strings.Join(prior, ", ") + ", " + host
	}
	r.Header["X-Forwarded-For"] = []string{v}
	return forwardedFor{prior: prior, had: had, set: true}
}

// restore puts back the X-Forwarded-For that appendForwardedFor edited.
func (f forwardedFor) restore(r *http.Request) {
	switch {
	case !f.set:
	case f.had:
		r.Header["X-Forwarded-For"] = f.prior
	default:
		delete(r.Header, "X-Forwarded-For")
	}
}

// corsExposed are the gateway's response headers a browser client may read.
const corsExposed = HeaderReplica + ", " + HeaderDecision + ", X-Exa-fleet.Disagg, X-Exa-Prefill-Replica, X-Exa-Prefill-Decision"

// cors applies Options.CORSOrigins to a request: with an Origin the list
// allows, the answer carries Access-Control-Allow-Origin (and Vary:
// Origin); a preflight (OPTIONS with Access-Control-Request-Method) is
// answered here with 204 and the methods and headers allowed. It returns
// true when it has answered. With no origins configured (the default) it
// does nothing: no CORS headers, and OPTIONS gets the endpoints' 405.
func (s *Server) cors(w http.ResponseWriter, r *http.Request) bool {
	origins := s.opts.CORSOrigins
	origin := r.Header.Get("Origin")
	if len(origins) == 0 || origin == "" {
		return false
	}
	h := w.Header()
	h.Add("Vary", "Origin")
	allowed := slices.Contains(origins, "*") || slices.Contains(origins, origin)
	if !allowed {
		return false
	}
	if slices.Contains(origins, "*") {
		h.Set("Access-Control-Allow-Origin", "*")
	} else {
		h.Set("Access-Control-Allow-Origin", origin)
	}
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		h.Set("Access-Control-Expose-Headers", corsExposed)
		return false
	}
	h.Add("Vary", "Access-Control-Request-Method")
	h.Add("Vary", "Access-Control-Request-Headers")
	h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
	if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
		h.Set("Access-Control-Allow-Headers", req)
	}
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// ValidCORSOrigin checks an Options.CORSOrigins entry: "*", or
// scheme://host[:port] with scheme http or https and nothing after the
// host, as browsers send it in Origin.
func ValidCORSOrigin(o string) error {
	if o == "*" {
		return nil
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" ||
		u.Fragment != "" || u.User != nil || u.String() != o {
		return fmt.Errorf("origin %q: want * or http(s)://HOST[:PORT], no path", o)
	}
	return nil
}

// serveStats serves GET /stats; ?model=NAME narrows it to one model (404
// when the gateway does not serve it).
func (s *Server) serveStats(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "", "gateway: /stats accepts GET only")
		return
	}
	st := s.Stats()
	if model := r.URL.Query().Get("model"); model != "" {
		rs, ok := st.Models[model]
		if !ok {
			writeError(w, http.StatusNotFound, typeNotFound, "model_not_found", "model", "gateway: model not found: "+strconv.Quote(model))
			return
		}
		st.Models = map[string]config.RoutingStats{model: rs}
	}
	writeJSON(w, st)
}

// serveModels serves GET /v1/models: the configured models, then the
// LoRA adapters the gateway serves, each with its model as parent.
func (s *Server) serveModels(w http.ResponseWriter, r *http.Request) {
	code := "200"
	defer func() { s.metrics.requests.WithLabelValues("", "models", code).Inc() }()
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		code = "405"
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "", "gateway: /v1/models accepts GET only")
		return
	}
	writeJSON(w, s.ModelList())
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		writeError(w, http.StatusInternalServerError, typeServer, "encode_error", "", "gateway: encode response: "+err.Error())
		return
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

// authorizeMetrics checks, when Options.PeerTokenFile is set, that a
// /metrics request carries "Authorization: Bearer <token>"; when it does
// not, it answers 401 (503 if the token file cannot be read) and returns
// false.
func (s *Server) authorizeMetrics(w http.ResponseWriter, r *http.Request) bool {
	tok, required, err := s.PeerToken()
	if !required {
		return true
	}
	if err != nil {
		s.log.Warn("gateway: /metrics refused: the peer token cannot be read", "err", err)
		writeError(w, http.StatusServiceUnavailable, typeUnavailable, "peer_token_unavailable", "", "gateway: /metrics needs a bearer token, and this gateway's token file cannot be read")
		return false
	}
	got, ok := bytes.CutPrefix([]byte(r.Header.Get("Authorization")), []byte("Bearer "))
	if !ok || subtle.ConstantTimeCompare(got, tok) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="exa-gateway"`)
		writeError(w, http.StatusUnauthorized, typeInvalidRequest, "invalid_api_key", "", "gateway: /metrics needs Authorization: Bearer with the peer token")
		return false
	}
	return true
}
