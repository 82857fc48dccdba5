package httpgw

import (
	"net/http"

	"github.com/examlops/gateway/internal/front"
)

// CodeRateLimited is the error code of a request refused by
// Options.RateLimit.
const CodeRateLimited = front.CodeRateLimited

// refused answers a request to a model endpoint that is not let in: 401
// without an API key in force (Options.APIKeysFile), 429 past its
// client's rate (Options.RateLimit). It reports whether it answered, and
// reads nothing of the body.
func (s *Server) refused(w http.ResponseWriter, r *http.Request, fail failFunc) bool {
	return s.unauthorized(w, r, fail) || s.overRate(w, r, fail)
}

// overRate answers 429 rate_limited, with Retry-After in whole seconds
// (at least 1), to a request whose client is over Options.RateLimit, and
// reports whether it did. It reads nothing of the body.
func (s *Server) overRate(w http.ResponseWriter, r *http.Request, fail failFunc) bool {
	if s.rate == nil {
		return false
	}
	ok, wait := s.rate.Allow(s.rate.Client(r.Header, r.RemoteAddr), s.opts.Clock())
	if ok {
		return false
	}
	lim := s.rate.Limit()
	w.Header().Set("Retry-After", front.RetryAfter(wait))
	fail(http.StatusTooManyRequests, front.TypeRateLimit, CodeRateLimited, "", front.RateLimitedText(lim, wait))
	return true
}
