package front_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
)

// TestMetricsBearerScheme: with a peer token, /metrics takes the token in
// the Bearer scheme whatever the scheme's case (RFC 7235 §2.1), after one
// or more spaces, and nothing else.
func TestMetricsBearerScheme(t *testing.T) {
	tokFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokFile, []byte("s3cret-token\n"), 0o600))
	fl, err := fleet.New(fleet.Options{PeerTokenFile: tokFile, Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	h := front.MetricsHandler(fl, prometheus.NewRegistry())
	for _, tt := range []struct {
		auth string
		code int
	}{
		{"Bearer s3cret-token", http.StatusOK},
		{"bearer s3cret-token", http.StatusOK},
		{"BEARER s3cret-token", http.StatusOK},
		{"bEaReR s3cret-token", http.StatusOK},
		{"Bearer   s3cret-token", http.StatusOK},
		{"", http.StatusUnauthorized},
		{"Bearer", http.StatusUnauthorized},
		{"Bearer ", http.StatusUnauthorized},
		{"Bearers3cret-token", http.StatusUnauthorized},
		{"Bearer wrong", http.StatusUnauthorized},
		{"bearer s3cret-token2", http.StatusUnauthorized},
		{"Basic s3cret-token", http.StatusUnauthorized},
		{"Bearer-x s3cret-token", http.StatusUnauthorized},
	} {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		assert.Equal(t, tt.code, rec.Code, "Authorization %q", tt.auth)
		if tt.code == http.StatusUnauthorized {
			assert.Equal(t, `Bearer realm="exa-gateway"`, rec.Header().Get("WWW-Authenticate"), "Authorization %q", tt.auth)
		}
	}
}
