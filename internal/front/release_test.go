package front

import (
	"testing"
	"time"

	"github.com/examlops/gateway"
)

// TestReleaseAtPrediction checks the rule both fronts share: a timer of
// PredictedTTFT only for a first token not seen, with a prediction.
func TestReleaseAtPrediction(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pred  time.Duration
		seen  bool
		timer bool
	}{
		{"unseen, predicted", 40 * time.Millisecond, false, true},
		{"seen", 40 * time.Millisecond, true, false},
		{"no prediction", 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got time.Duration
			started := false
			stop := ReleaseAtPrediction(gateway.Decision{PredictedTTFT: tc.pred}, tc.seen, func(d time.Duration, f func()) func() bool {
				got, started = d, true
				return func() bool { return true }
			})
			if started != tc.timer || (stop != nil) != tc.timer {
				t.Fatalf("timer started %v, stop %v; want %v", started, stop != nil, tc.timer)
			}
			if tc.timer && got != tc.pred {
				t.Fatalf("timer of %v, want %v", got, tc.pred)
			}
		})
	}
}
