package main

import (
	"errors"
	"testing"

	"github.com/examlops/gateway/config"
)

// FuzzClassifyConfig: any --config-file bytes are either a valid routing
// configuration, GIE's EndpointPickerConfig, or an error (a usage error
// or a corrupt/invalid configuration); never a panic.
func FuzzClassifyConfig(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"models":{"m":{"mode":"cache_aware"}}}`,
		`{}`, `{"version":1,"models":{"m":{"mode":"nope"}}}`, `{`,
		"apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins: []\n",
		"kind: Deployment\n", "", "\x00", "kind: [", "- a\n- b\n",
		"kind: EndpointPickerConfig\nplugins:\n- type: metrics-data-source\n  parameters: {path: [1], scheme: null}\n- type: core-metrics-extractor\n  parameters: 3\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = gieUnread(data, false) // never a panic
		own, err := classifyConfig("fuzz", data)
		if err != nil {
			var ue *usageError
			if own || !(errors.As(err, &ue) || errors.Is(err, config.ErrCorrupt) || errors.Is(err, config.ErrInvalid)) {
				t.Fatalf("own %v, err %v", own, err)
			}
			return
		}
		if own {
			if _, err := config.Decode("fuzz", data); err != nil {
				t.Fatalf("accepted as a routing configuration but does not decode: %v", err)
			}
		}
	})
}
