package gateway

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// FuzzModeText: any text either unmarshals to a built-in Mode, which
// marshals back to its canonical name and parses again to itself, or is
// an error wrapping ErrInvalid that quotes the text; never a panic.
func FuzzModeText(f *testing.F) {
	for _, s := range []string{"", "round_robin", "cache-aware", "load_aware", "Cache_Aware", "fastest", "cache_aware\x00", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var m Mode
		err := m.UnmarshalText([]byte(s))
		if err != nil {
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) {
				t.Fatalf("UnmarshalText(%q): %v", s, err)
			}
			return
		}
		text, err := m.MarshalText()
		if err != nil {
			t.Fatalf("%q read as %v, which does not marshal: %v", s, m, err)
		}
		if string(text) != m.String() || (s != "" && strings.ReplaceAll(s, "-", "_") != string(text)) {
			t.Fatalf("%q read as %v, written %q", s, m, text)
		}
		back, err := parseMode(string(text))
		if err != nil || back != m {
			t.Fatalf("%q does not parse back to %v: %v, %v", text, m, back, err)
		}
	})
}
