package front

import (
	"testing"
	"time"
)

// TestRetryAfter: one scrape interval rounded up to a second, at least 1.
func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		scrape time.Duration
		want   string
	}{
		{0, "1"}, {10 * time.Millisecond, "1"}, {time.Second, "1"},
		{time.Second + 1, "2"}, {2500 * time.Millisecond, "3"}, {time.Minute, "60"},
	} {
		if got := RetryAfter(tc.scrape); got != tc.want {
			t.Errorf("RetryAfter(%v) = %q, want %q", tc.scrape, got, tc.want)
		}
	}
}
