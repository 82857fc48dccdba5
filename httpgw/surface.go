package httpgw

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/examlops/gateway/internal/front"
)

// serveHealth serves GET /health as vLLM's does: 200 with an empty body
// while the gateway can serve, that is while some configured model has a
// healthy replica; otherwise 503 with an OpenAI error naming the cause.
// (/healthz stays the process's liveness: always 200.)
func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		front.WriteError(w, http.StatusMethodNotAllowed, front.TypeInvalidRequest, "method_not_allowed", "", "gateway: /health accepts GET only")
		return
	}
	st := s.Snapshot()
	if len(st.Models) == 0 {
		front.WriteError(w, http.StatusServiceUnavailable, front.TypeUnavailable, "no_models", "", "gateway: no model configured")
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
	front.WriteError(w, http.StatusServiceUnavailable, front.TypeUnavailable, "no_healthy_replica", "", "gateway: no healthy replica of any model")
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
const corsExposed = HeaderReplica + ", " + HeaderDecision + ", " + HeaderDisagg + ", " + HeaderPrefillReplica + ", " + HeaderPrefillDecision

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
	h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
	if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
		h.Set("Access-Control-Allow-Headers", req)
	}
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// copyAnswerHeaders copies the end-to-end headers of an engine's answer
// to the client's (copyHeaders). With Options.CORSOrigins set, the
// gateway's CORS answer (cors) is the one the browser gets: the engine's
// own Access-Control-* headers are dropped (vLLM's middleware allows any
// origin by default, which would undo the gateway's list) and its Vary
// values are added to the gateway's Vary: Origin.
func (s *Server) copyAnswerHeaders(dst, src http.Header) {
	if len(s.opts.CORSOrigins) == 0 {
		copyHeaders(dst, src)
		return
	}
	var own http.Header
	for k, vv := range dst {
		if k == "Vary" || strings.HasPrefix(k, "Access-Control-") {
			if own == nil {
				own = http.Header{}
			}
			own[k] = vv
		}
	}
	copyHeaders(dst, src)
	engineVary := dst["Vary"]
	for k := range dst {
		if strings.HasPrefix(http.CanonicalHeaderKey(k), "Access-Control-") {
			delete(dst, k)
		}
	}
	for k, vv := range own {
		dst[k] = vv
	}
	if len(own["Vary"]) > 0 && len(engineVary) > 0 {
		dst["Vary"] = append(slices.Clip(own["Vary"]), engineVary...)
	}
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
