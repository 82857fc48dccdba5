package flow

import (
	"math"
	"testing"
)

// TestRateAdmitSaturates: at times near the int64 limit an admitted
// request's next theoretical arrival time must not wrap to a negative
// time, which would admit every later request.
func TestRateAdmitSaturates(t *testing.T) {
	r := Rate{PerSecond: 1, Burst: 1}
	now := int64(math.MaxInt64 - 10)
	tat, wait := r.Admit(0, now)
	if wait != 0 {
		t.Fatalf("first request refused, wait %v", wait)
	}
	if tat < now {
		t.Fatalf("next tat %d wrapped below now %d", tat, now)
	}
	if _, wait := r.Admit(tat, now); wait == 0 {
		t.Fatal("a second request at the same time admitted past a burst of 1")
	}
}
