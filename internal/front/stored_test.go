package front

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestParseStored: the id and operation of each stored-response path,
// 405 naming the methods for another method, 404 for another path.
func TestParseStored(t *testing.T) {
	for _, tc := range []struct {
		method, path, id, op string
		status               int
		allow                string
	}{
		{"GET", "/v1/responses/resp_1", "resp_1", "", 0, ""},
		{"DELETE", "/v1/responses/resp_1", "resp_1", "", 0, ""},
		{"POST", "/v1/responses/resp_1/cancel", "resp_1", "cancel", 0, ""},
		{"GET", "/v1/responses/resp_1/input_items", "resp_1", "input_items", 0, ""},
		{"POST", "/v1/responses/resp_1", "", "", http.StatusMethodNotAllowed, "GET, DELETE"},
		{"GET", "/v1/responses/resp_1/cancel", "", "", http.StatusMethodNotAllowed, "POST"},
		{"ET", "/v1/responses/resp_1", "", "", http.StatusMethodNotAllowed, "GET, DELETE"},
		{"GET", "/v1/responses/", "", "", http.StatusNotFound, ""},
		{"GET", "/v1/responses/resp_1/input_items/x", "", "", http.StatusNotFound, ""},
		{"GET", "/v1/responses//cancel", "", "", http.StatusNotFound, ""},
		{"GET", "/v1/responses/resp_1/", "", "", http.StatusNotFound, ""},
		{"GET", "/v1/other/resp_1", "", "", http.StatusNotFound, ""},
	} {
		sr, err := ParseStored(tc.method, tc.path)
		if tc.status == 0 {
			assert.Nil(t, err, "%s %s", tc.method, tc.path)
			assert.Equal(t, StoredRequest{ID: tc.id, Op: tc.op}, sr, "%s %s", tc.method, tc.path)
			continue
		}
		if assert.NotNil(t, err, "%s %s", tc.method, tc.path) {
			assert.Equal(t, tc.status, err.Status, "%s %s", tc.method, tc.path)
			assert.Equal(t, tc.allow, err.Allow, "%s %s", tc.method, tc.path)
			assert.Contains(t, err.Error(), tc.path)
		}
	}
}

// FuzzParseStored: any method and path give a request whose id is a
// non-empty path element and whose operation is one of the three, or an
// error answering 404 or 405; never a panic.
func FuzzParseStored(f *testing.F) {
	for _, s := range [][2]string{{"GET", "/v1/responses/resp_1"}, {"POST", "/v1/responses/r/cancel"}, {"DELETE", "/v1/responses/"},
		{"GET", "/v1/responses/a/input_items"}, {"PUT", "/v1/responses/a/b/c"}, {"", ""}, {"GET", "/v1/responses/%2F/cancel"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, method, path string) {
		sr, err := ParseStored(method, path)
		if err != nil {
			if (err.Status != http.StatusNotFound && err.Status != http.StatusMethodNotAllowed) || err.Err == nil {
				t.Fatalf("%q %q: error %+v", method, path, err)
			}
			return
		}
		if sr.ID == "" || strings.Contains(sr.ID, "/") || (sr.Op != "" && sr.Op != "cancel" && sr.Op != "input_items") ||
			path != StoredPrefix+sr.ID+map[bool]string{true: "", false: "/" + sr.Op}[sr.Op == ""] {
			t.Fatalf("%q %q: %+v", method, path, sr)
		}
	})
}

// FuzzClientOf: any address gives "", an IP address, or an IPv6 /64
// prefix; never a panic.
func FuzzClientOf(f *testing.F) {
	for _, s := range []string{"10.0.0.1:80", "[2001:db8::1]:443", "::1", "[fe80::1%eth0]:1", "", "x", "1.2.3.4, 5.6.7.8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		c := ClientOf(addr)
		if c != "" && c != ClientOf(c) && !strings.HasSuffix(c, "/64") {
			t.Fatalf("ClientOf(%q) = %q, not stable", addr, c)
		}
	})
}
