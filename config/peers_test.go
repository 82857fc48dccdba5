package config

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidatePeers(t *testing.T) {
	many := make([]string, MaxPeers+1)
	for i := range many {
		many[i] = fmt.Sprintf("http://gw%d:8080", i)
	}
	for _, tc := range []struct {
		name   string
		peers  []string
		field  string
		value  string
		reason string
	}{
		{"empty", []string{"http://a:8080", ""}, "peers[1]", "", "must not be empty"},
		{"ftp", []string{"ftp://a"}, "peers[0]", "ftp://a", `scheme "ftp", want http or https`},
		{"query", []string{"http://a:8080/?x=1"}, "peers[0]", "http://a:8080/?x=1", "must not have a query or fragment"},
		{"credentials", []string{"http://u:p@a:8080"}, "peers[0]", "http://u:p@a:8080", "must not contain credentials (user@ or user:password@)"},
		{"port", []string{"a:0"}, "peers[0]", "a:0", "port 0 out of range 1..65535"},
		{"twice", []string{"http://a:8080", "http://b:8080", "http://a:8080"}, "peers[2]", "http://a:8080", "the same gateway as peers[0]"},
		{"twice, spelt otherwise", []string{"a:8080", "HTTP://A:8080/"}, "peers[1]", "HTTP://A:8080/", "the same gateway as peers[0]"},
		{"too many", many, "peers", "65 peers", "at most 64"},
		{"dns without scheme", []string{"dns+gw:8080"}, "peers[0]", "dns+gw:8080", "a dns+ peer must be dns+http://NAME:PORT or dns+https://NAME:PORT"},
		{"dns over ftp", []string{"dns+ftp://gw:8080"}, "peers[0]", "dns+ftp://gw:8080", "a dns+ peer must be dns+http://NAME:PORT or dns+https://NAME:PORT"},
		{"dns over https, twice", []string{"dns+https://gw:8080", "DNS+HTTPS://GW:8080/"}, "peers[1]", "DNS+HTTPS://GW:8080/", "the same gateway as peers[0]"},
		{"dns, bad port", []string{"dns+http://gw:0"}, "peers[0]", "dns+http://gw:0", "port 0 out of range 1..65535"},
		{"dns twice", []string{"DNS+http://GW:8080", "dns+http://gw:8080/"}, "peers[1]", "dns+http://gw:8080/", "the same gateway as peers[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidatePeers(tc.peers)
			require.ErrorIs(t, err, ErrInvalid)
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, FieldError{Field: tc.field, Value: tc.value, Reason: tc.reason}, *fe)

			m := Model{Peers: tc.peers}
			err = m.Validate()
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, tc.field, fe.Field, "through Model.Validate")
			f := &File{Version: Version, Models: map[string]Model{"JPCP": m}}
			require.ErrorAs(t, f.Validate(), &fe)
			assert.Equal(t, "models.JPCP."+tc.field, fe.Field, "through File.Validate")
		})
	}
	for _, ok := range [][]string{nil, {}, {"http://gw-b:8080"}, {"gw-b:8080", "https://gw-c.example/exa", "http://gw-b:8081"}, many[:MaxPeers], {"dns+http://gw-peers.ns.svc:8080", "http://gw-peers.ns.svc:8080"}, {"dns+https://gw-peers.ns.svc:8443", "dns+http://gw-peers.ns.svc:8443"}} {
		assert.NoError(t, ValidatePeers(ok), "%q", ok)
	}
	m := Model{Peers: []string{"http://a:1"}}
	c := m.Clone()
	c.Peers[0] = "http://b:1"
	assert.Equal(t, "http://a:1", m.Peers[0], "Clone copies the peers")
}
