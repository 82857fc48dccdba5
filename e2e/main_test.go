//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"testing"
)

// envReverseProxy makes the test binary, re-executed by TestAddedLatency,
// run a bare standard-library reverse proxy ("TARGET_URL LISTEN_ADDR")
// instead of the tests: the baseline cost of any Go proxy hop.
const envReverseProxy = "EXA_E2E_REVERSE_PROXY"

func TestMain(m *testing.M) {
	if spec := os.Getenv(envReverseProxy); spec != "" {
		target, listen, _ := strings.Cut(spec, " ")
		u, err := url.Parse(target)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, http.ListenAndServe(listen, httputil.NewSingleHostReverseProxy(u)))
		os.Exit(1)
	}
	os.Exit(m.Run())
}
