package main

import (
	"io"
	"testing"
)

// TestExample runs the example and checks the two behaviours it shows:
// at idle each session keeps one engine and the sessions of different
// assistants spread over all three; under a burst sharing one system
// prompt the requests spread over all three engines rather than piling
// onto the one that holds the prompt.
func TestExample(t *testing.T) {
	res, err := run(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	home := map[string]string{} // assistant -> engine
	for _, s := range sessions {
		turns := res.Idle[s.name]
		if len(turns) != 3 {
			t.Fatalf("%s: %d turns routed, want 3", s.name, len(turns))
		}
		for _, e := range turns[1:] {
			if e != turns[0] {
				t.Errorf("%s moved from %s to %s at idle: %v", s.name, turns[0], e, turns)
			}
		}
		if h, ok := home[s.assistant]; ok && h != turns[0] {
			t.Errorf("%s's sessions on %s and %s at idle", s.assistant, h, turns[0])
		}
		home[s.assistant] = turns[0]
	}
	engines := map[string]bool{}
	for _, e := range home {
		engines[e] = true
	}
	if len(engines) != len(assistants) {
		t.Errorf("the %d assistants' sessions use engines %v, want one each", len(assistants), home)
	}

	if len(res.Burst) != burst {
		t.Fatalf("%d burst requests routed, want %d", len(res.Burst), burst)
	}
	// Every engine takes part, the one holding the prompt included, and
	// none takes more than half.
	for _, e := range []string{"e0", "e1", "e2"} {
		if n := countOf(res.Burst, e); n == 0 || n > burst/2 {
			t.Errorf("engine %s got %d of the %d concurrent requests: %v", e, n, burst, res.Burst)
		}
	}
}
