package fleetpick

import (
	"errors"
	"net/http"
	"strings"

	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/picker"
)

// CheckHead implements picker.HeadChecker: a request to a model endpoint
// whose client is over Options.RateLimit is refused with 429
// rate_limited, its Retry-After the wait until one would be admitted,
// before its body is read, and counted under its endpoint, as the HTTP
// gateway refuses and counts it. As there, GET /v1/models, paths the
// picker does not route and a method other than POST on a prompt or
// pass-through endpoint (405 from Pick) are not limited; every method on
// a stored response is.
func (r *Router) CheckHead(req *picker.PickRequest) error {
	if r.rate == nil {
		return nil
	}
	endpoint := limitedEndpoint(req.Method, pathOf(req))
	if endpoint == "" {
		return nil
	}
	// &req.Header: a pointer boxes without allocating, the slice would not.
	ok, wait := r.rate.Allow(r.rate.Client(&req.Header, clientOf(req)), r.opts.Clock())
	if ok {
		return nil
	}
	r.metrics.Requests.WithLabelValues("", endpoint, "429").Inc()
	return &picker.StatusError{Status: http.StatusTooManyRequests, Type: front.TypeRateLimit, Code: front.CodeRateLimited,
		Err: errors.New(front.RateLimitedText(r.rate.Limit(), wait)), RetryAfter: wait}
}

// limitedEndpoint is the endpoint label of a request the rate limit
// covers, "" for one it does not.
func limitedEndpoint(method, path string) string {
	if strings.HasPrefix(path, front.StoredPrefix) {
		return "responses"
	}
	if method != http.MethodPost {
		return ""
	}
	if kind, ok := promptKind(path); ok {
		return kind.String()
	}
	return passEndpoints[path]
}
