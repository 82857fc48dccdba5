package front

import (
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/require"
)

// TestFillAdmission: a bad threshold is refused by an error naming its
// field and value, PendingPrefill's as the others' (the simulator's and
// the CLI's rule); a load threshold without Staleness gets three scrape
// intervals.
func TestFillAdmission(t *testing.T) {
	for _, tc := range []struct {
		name string
		a    gateway.Admission
		want string
	}{
		{"queue depth", gateway.Admission{QueueDepth: -1}, "Admission.QueueDepth -1 is negative"},
		{"outstanding", gateway.Admission{Outstanding: -2}, "Admission.Outstanding -2 is negative"},
		{"pending prefill", gateway.Admission{PendingPrefill: -3}, "Admission.PendingPrefill -3 is negative"},
		{"staleness", gateway.Admission{QueueDepth: 1, Staleness: -time.Second}, "Admission.Staleness -1s is negative"},
		{"kv", gateway.Admission{KVUtilization: 1.5}, "Admission.KVUtilization 1.5 is outside 0..1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.a
			require.EqualError(t, FillAdmission(&a, time.Second), tc.want)
		})
	}
	a := gateway.Admission{QueueDepth: 5}
	require.NoError(t, FillAdmission(&a, time.Second))
	require.Equal(t, 3*time.Second, a.Staleness)
	a = gateway.Admission{PendingPrefill: 8}
	require.NoError(t, FillAdmission(&a, time.Second))
	require.Zero(t, a.Staleness, "pending prefill is the front's own count: never stale")
}

// TestAdmissionText: a shed request's message names every threshold set,
// pending prefill's too (a rule of --shed-pending-prefill alone named
// none: "no eligible replica has room ()").
func TestAdmissionText(t *testing.T) {
	require.Equal(t, "pending prefill >= 64 blocks", AdmissionText(gateway.Admission{PendingPrefill: 64}))
	require.Equal(t, "queue >= 5, KV cache >= 0.8, outstanding >= 3, pending prefill >= 2 blocks, load older than 1s",
		AdmissionText(gateway.Admission{QueueDepth: 5, KVUtilization: 0.8, Outstanding: 3, PendingPrefill: 2, Staleness: time.Second}))
}
