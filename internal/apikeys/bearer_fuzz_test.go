package apikeys

import (
	"strings"
	"testing"
)

// FuzzBearerToken: on any Authorization value, bearerToken accepts exactly
// the values whose first space-separated word is "bearer" in any case, and
// returns what follows the spaces after it.
func FuzzBearer(f *testing.F) {
	for _, s := range []string{"Bearer tok", "bearer tok", "BEARER  tok", "Bearer", "Bearer ", "Basic tok", "Bearertok", "", " Bearer tok", "Bearer\ttok", "bEaReR a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		tok, ok := Bearer(v)
		i := strings.IndexByte(v, ' ')
		want := i >= 0 && strings.EqualFold(v[:i], "bearer")
		if ok != want {
			t.Fatalf("Bearer(%q) ok %v, want %v", v, ok, want)
		}
		if ok && tok != strings.TrimLeft(v[i+1:], " ") {
			t.Fatalf("Bearer(%q) = %q", v, tok)
		}
	})
}
