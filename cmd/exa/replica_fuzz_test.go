package main

import (
	"strings"
	"testing"

	"github.com/examlops/gateway/config"
)

// FuzzParseReplica: a --replica NAME=ADDRESS or --pool POOL:NAME=ADDRESS
// value either gives a replica the configuration accepts (name and
// address valid, String gives back a value that parses to the same), or
// an error saying which part is wrong; never a panic, and a refused
// --pool value adds nothing.
func FuzzParseReplica(f *testing.F) {
	for _, s := range []string{
		"r0=http://10.0.0.1:8000", " r0 = 10.0.0.1:8000 ", "r0=https://[fd00::1]:8443", "=x", "r0=", "r0",
		"r0=ftp://x", "r0=http://h:99999", "r\x00=http://h:1", "a=b=c", "prefill:p0=http://10.0.1.1:8000",
		"p:q:r=http://h:1", ":r=h:1", "p=q:r=h:1", "r0=http://u@h:1", "r0=h:1#x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := parseReplica(s)
		if err != nil {
			msg := err.Error()
			if err != errReplicaFormat && !strings.HasPrefix(msg, "name ") && !strings.HasPrefix(msg, "address ") {
				t.Fatalf("parseReplica(%q): error %q names neither the name nor the address", s, msg)
			}
		} else {
			if config.ValidateName(r.Name) != nil || config.ValidateAddress(r.Address) != nil {
				t.Fatalf("parseReplica(%q) accepted %+v", s, r)
			}
			back, err := parseReplica(r.Name + "=" + r.Address)
			if err != nil || back != r {
				t.Fatalf("parseReplica(%q) = %+v, which reads back as %+v, %v", s, r, back, err)
			}
		}
		var pv poolsValue
		if err := pv.Set(s); err != nil {
			if len(pv.pools) != 0 {
				t.Fatalf("refused --pool %q but kept %v", s, pv.pools)
			}
			return
		}
		for pool, reps := range pv.pools {
			if config.ValidateName(pool) != nil || len(reps) != 1 {
				t.Fatalf("--pool %q gave pools %v", s, pv.pools)
			}
			var again poolsValue
			if err := again.Set(pv.String()); err != nil || again.String() != pv.String() {
				t.Fatalf("--pool %q: String %q does not read back (%v)", s, pv.String(), err)
			}
		}
	})
}
