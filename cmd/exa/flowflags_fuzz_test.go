package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// FuzzFlowFlags: --objective and --flow-usage-limit values, as an
// operator or a templated manifest gives them. Options never panics; an
// error names its flag and quotes the value it refuses; an accepted
// objective maps its name to the integer after its '=', and an accepted
// usage limit is a valid fraction, each read back from its own text.
func FuzzFlowFlags(f *testing.F) {
	for _, s := range [][4]string{
		{"interactive=1", "batch=-1", "0=0.5", "1=1"},
		{"a=b", "", "x=0.5", ""},
		{"=3", "c=2", "0=0", "0=1.5"},
		{"n=1", "n=2", "2=NaN", "2=0.25"},
		{"q=9223372036854775808", "é=-0", "-1=1e-300", "3=+Inf"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, o1, o2, u1, u2 string) {
		var objs, lims []string
		for _, s := range []string{o1, o2} {
			if s != "" {
				objs = append(objs, s)
			}
		}
		for _, s := range []string{u1, u2} {
			if s != "" {
				lims = append(lims, s)
			}
		}
		var fl flowFlags
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		fl.register(fs)
		if err := fs.Parse([]string{"--flow-control"}); err != nil {
			t.Fatal(err)
		}
		fl.objectives, fl.usageLimits = objs, lims
		o, err := fl.options()
		if err != nil {
			msg := err.Error()
			named := false
			for _, v := range append(append([]string{}, objs...), lims...) {
				if strings.Contains(msg, fmt.Sprintf("%q", v)) {
					named = true
				}
			}
			if !named || !strings.Contains(msg, "--objective") && !strings.Contains(msg, "--flow-usage-limit") {
				t.Fatalf("error %q names neither the flag nor a value of %q %q", msg, objs, lims)
			}
			return
		}
		if len(o.Objectives) != len(objs) || len(o.UsageLimits) != len(lims) {
			t.Fatalf("accepted %q %q as %v %v: one lost", objs, lims, o.Objectives, o.UsageLimits)
		}
		for _, kv := range objs {
			name, p, _ := strings.Cut(kv, "=")
			want, err := strconv.Atoi(p)
			if err != nil || o.Objectives[name] != want {
				t.Fatalf("--objective %q read as %s=%d", kv, name, o.Objectives[name])
			}
		}
		for _, kv := range lims {
			p, v, _ := strings.Cut(kv, "=")
			prio, _ := strconv.Atoi(p)
			c, err := strconv.ParseFloat(v, 64)
			if err != nil || o.UsageLimits[prio] != c || !(c > 0 && c <= 1) {
				t.Fatalf("--flow-usage-limit %q read as %d=%v", kv, prio, o.UsageLimits[prio])
			}
		}
	})
}
