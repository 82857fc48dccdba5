package fleet

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestHealthState(t *testing.T) {
	type step struct {
		op   string // "fail", "fatal", "probe-ok", "traffic-ok"
		want HealthEvent
	}
	tests := []struct {
		name          string
		eject, readmt int
		steps         []step
		healthy       bool
	}{
		{name: "ejected after threshold", eject: 2, readmt: 2,
			steps: []step{{"fail", healthNoChange}, {"fail", healthEjected}}, healthy: false},
		{name: "success resets failures", eject: 2, readmt: 2,
			steps: []step{{"fail", healthNoChange}, {"traffic-ok", healthNoChange}, {"fail", healthNoChange}}, healthy: true},
		{name: "fatal ejects at once", eject: 3, readmt: 1,
			steps: []step{{"fatal", healthEjected}}, healthy: false},
		{name: "readmitted after probe threshold", eject: 1, readmt: 2,
			steps: []step{{"fail", healthEjected}, {"probe-ok", healthNoChange}, {"probe-ok", healthReadmitted}}, healthy: true},
		{name: "traffic success does not readmit", eject: 1, readmt: 1,
			steps: []step{{"fail", healthEjected}, {"traffic-ok", healthNoChange}}, healthy: false},
		{name: "failure between probes restarts readmission", eject: 1, readmt: 2,
			steps: []step{{"fail", healthEjected}, {"probe-ok", healthNoChange}, {"fail", healthNoChange}, {"probe-ok", healthNoChange}}, healthy: false},
		{name: "zero thresholds act as one", eject: 0, readmt: 0,
			steps: []step{{"fail", healthEjected}, {"probe-ok", healthReadmitted}}, healthy: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &Health{ejectAfter: tt.eject, readmitAfter: tt.readmt}
			for i, s := range tt.steps {
				var got HealthEvent
				switch s.op {
				case "fail":
					got = h.Failure(false)
				case "fatal":
					got = h.Failure(true)
				case "probe-ok":
					got = h.Success(true)
				case "traffic-ok":
					got = h.Success(false)
				}
				assert.Equal(t, s.want, got, "step %d (%s)", i, s.op)
			}
			assert.Equal(t, tt.healthy, h.Healthy())
		})
	}
}
