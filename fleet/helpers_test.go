package fleet

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/examlops/gateway/internal/testport"
	"github.com/stretchr/testify/require"
)

func newHTTPTestServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

const testModel = "m1"

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func freeTCP(t testing.TB) string {
	t.Helper()
	return "tcp://" + testport.Addr(t)
}

// recordedPages returns the engines' /metrics pages recorded in
// testdata/metrics, the fuzz targets' seeds.
func recordedPages(tb testing.TB) [][]byte {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "metrics", "*.txt"))
	require.NoError(tb, err)
	require.NotEmpty(tb, files)
	var pages [][]byte
	for _, name := range files {
		b, err := os.ReadFile(name)
		require.NoError(tb, err)
		pages = append(pages, b)
	}
	return pages
}

// envInt returns the environment variable name as a number, else def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}
