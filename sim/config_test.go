package sim

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/examlops/gateway"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPolicyErrors: a policy the gateway cannot build is an invalid config
// whose message starts with "gateway:" and names the policy and value.
func TestPolicyErrors(t *testing.T) {
	tests := []struct {
		name   string
		pol    Policy
		want   []string
		alsoIs error
	}{
		{"unknown mode", Policy{Name: "m7", Mode: 7}, []string{`"m7"`, "Mode 7"}, nil},
		{"negative mode", Policy{Name: "neg", Mode: -1}, []string{`"neg"`, "Mode -1"}, nil},
		{"nil custom policy", Policy{Name: "nil", New: func(uint64) gateway.Policy { return nil }}, []string{`"nil"`, "nil policy"}, gateway.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Run(Config{Workload: mustShared(t), Replicas: 1, Policies: []Policy{tt.pol}})
			require.ErrorIs(t, err, ErrInvalidConfig)
			if tt.alsoIs != nil {
				require.ErrorIs(t, err, tt.alsoIs)
			}
			assert.True(t, strings.HasPrefix(err.Error(), "gateway:"), err.Error())
			for _, s := range tt.want {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
	t.Run("every built-in mode is accepted", func(t *testing.T) {
		w := mustShared(t)
		for _, m := range []gateway.Mode{gateway.ModeRoundRobin, gateway.ModeCacheAware, gateway.ModeLoadAware} {
			_, err := Run(Config{Workload: w, Replicas: 1, Policies: []Policy{{Name: m.String(), Mode: m}}})
			require.NoError(t, err, m)
		}
	})
	t.Run("a trace error starts with gateway:", func(t *testing.T) {
		w, err := TraceBytes("bad", []byte(traceLineAt("1")+"\n{}\n"), TraceOptions{})
		require.NoError(t, err)
		_, err = Run(Config{Workload: w, Replicas: 1})
		require.ErrorIs(t, err, ErrMalformedTrace)
		assert.True(t, strings.HasPrefix(err.Error(), "gateway:"), err.Error())
	})
}

// TestPresetCoefficientsFinite: NaN, infinite or negative cost
// coefficients are rejected, naming the field and value.
func TestPresetCoefficientsFinite(t *testing.T) {
	fields := map[string]func(*Preset) *float64{
		"StepOverhead":          func(p *Preset) *float64 { return &p.StepOverhead },
		"PrefillPerToken":       func(p *Preset) *float64 { return &p.PrefillPerToken },
		"PrefillQuadratic":      func(p *Preset) *float64 { return &p.PrefillQuadratic },
		"DecodePerSeq":          func(p *Preset) *float64 { return &p.DecodePerSeq },
		"DecodePerContextToken": func(p *Preset) *float64 { return &p.DecodePerContextToken },
	}
	for field, at := range fields {
		for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1e-9} {
			t.Run(fmt.Sprintf("%s=%v", field, v), func(t *testing.T) {
				p := DefaultPreset()
				*at(&p) = v
				err := p.validate()
				require.ErrorIs(t, err, ErrInvalidConfig)
				assert.Contains(t, err.Error(), field)
				assert.True(t, strings.HasPrefix(err.Error(), "gateway:"))
				_, err = Run(Config{Preset: p, Replicas: 1, Workload: mustShared(t)})
				require.ErrorIs(t, err, ErrInvalidConfig)
			})
		}
	}
}

func mustShared(t *testing.T) Workload {
	t.Helper()
	w, err := SharedPrefix(SharedPrefixConfig{Requests: 10})
	require.NoError(t, err)
	return w
}
