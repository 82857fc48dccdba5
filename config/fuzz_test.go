package config

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzDecode: every byte string either decodes to a configuration that
// validates and round-trips (Encode, Decode again: the same configuration,
// and Encode again: the same bytes), or is rejected with an error wrapping
// ErrCorrupt or ErrInvalid that names the file. It never panics. Its
// error message holds no character that is not printable, so that a
// hostile file cannot drive the terminal it is printed to.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		``, `null`, `{}`, `[]`, `"x"`, `1`, `true`,
		`{"version":1,"models":{}}`,
		`{"version":2}`, `{"version":0}`, `{"version":1} {}`,
		`{"models":null}`, `{"models":{"M":null}}`, `{"models":{"M":{},"M":{}}}`, `{"Models":{}}`,
		`{"models":{"M":{"replicas":[],"pools":{"p":[]}}}}`,
		`{"models":{"M":{"mode":"cache-aware"}}}`,
		`{"models":{"M":{"load_weights":{"queue":1e308,"kv":-0,"latency":5e-324}}}}`,
		`{"models":{"M":{"replicas":[{"name":"r0","address":"ftp://x"}]}}}`,
		`{"models":{"M":{"replicas":[{"name":"r0","address":"http://h:99999"}]}}}`,
		`{"models":{"M":{"replicas":[{"name":"r0","address":"http://h\u0001:80"}]}}}`,
		`{"models":{"M":{"replicas":[{"name":"r0","address":"10.0.0.1:8000","cache_blocks":2147483646}]}}}`,
		`{"models":{"\u001b[31m":{}}}`, `{"models":{"a\ud800b":{}}}`,
		`{"models":{"a\u200bb":{"mode":"x"}}}`, `{"models":{"a.b":{"pools":{"p\u00ad":[{"name":"x","address":""}]}}}}`,
		`{"models":{"M":{"slo_latency_ms":9223372036854}}}`,
		`{"models":{"M":{"disaggregate":true,"prefill_pool":"p","decode_pool":"d","pools":{"p":[{"name":"p0","address":"http://p"}]}}}}`,
		`{"models":{"M":{"disaggregate":true,"prefill_pool":"p","decode_pool":"d","pd_mode":"sidecar","pd_min_uncached_tokens":0}}}`,
		`{"models":{"M":{"pd_mode":"gateway","pd_min_uncached_tokens":512}}}`,
		`{"models":{"M":{"peers":["dns+http://gw.ns.svc:8080","http://gw-b:8080"]}}}`,
		`{"models":{"M":{"peers":["DNS+https://gw:1","dns+gw:8080","dns+http://gw:0"]}}}`,
		`{"models":{"M":{"pd_mode":"both"}}}`, `{"models":{"M":{"pd_min_uncached_tokens":-1}}}`,
		`{"models":{"M":{"pd_min_uncached_tokens":1e3}}}`, `{"models":{"M":{"pd_min_uncached_tokens":null}}}`,
		`{"models":{"M":{"mode":"cache_aware","index":"exact","block_size":16,"kv_events_bind":"tcp://*:5557","replicas":[{"name":"r0","address":"10.0.0.1:8000","pod":"10.0.0.1"}]}}}`,
		`{"models":{"M":{"mode":"cache_aware","index":"exact","replicas":[{"name":"r0","address":"10.0.0.1:8000","kv_events":"tcp://10.0.0.1:5557"},{"name":"r1","address":"10.0.0.2:8000","kv_events":"tcp://10.0.0.1:5557","pod":"10.0.0.1:8000"}]}}}`,
		`{"models":{"M":{"index":"exact","block_size":-1,"kv_events_bind":"tcp://[::1]:0"}}}`,
		`{"models":{"M":{"mode":"cache_aware","adapters":["a","b"],"replicas":[{"name":"r0","address":"h:1"}]},"N":{"adapters":["a","a"]}}}`,
		`{"models":{"M":{"index":"approximate","kv_events_bind":"ipc:///tmp/x","replicas":[{"name":"r0","address":"h:1","kv_events":"tcp://*:1","pod":"a@b"}]}}}`,
		`{"models":{"A":{"mode":"cache_aware","index":"exact","kv_events_bind":"tcp://h:1"},"B":{"replicas":[{"name":"r","address":"h:2","kv_events":"tcp://h:1"}]}}}`,
		`{"models":{"M":{"kv_events_bind":"tcp://10.0.0.2:1","kv_events_allow":["10.0.0.1","10.0.1.0/24","::1","fd00::/8"]}}}`,
		`{"models":{"M":{"kv_events_allow":["10.0.0.1/33","x","::ffff:10.0.0.0/120","fe80::1%eth0","10.0.0.1","10.0.0.1"]}}}`,
		`{"models":{"M":{"kv_events_allow":"10.0.0.1"}}}`,
	} {
		f.Add([]byte(seed))
	}
	if data, err := Encode(&File{Models: map[string]Model{"JPCP": sample()}}); err == nil {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const name = "fuzz.json"
		g, err := Decode(name, data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %q wraps neither ErrCorrupt nor ErrInvalid", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, name) {
				t.Fatalf("error %q does not name the file", msg)
			}
			if i := strings.IndexFunc(msg, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }); i >= 0 || !utf8.ValidString(msg) {
				t.Fatalf("error %q holds an unprintable character", msg)
			}
			return
		}
		if err := g.Validate(); err != nil {
			t.Fatalf("decoded a configuration that does not validate: %v", err)
		}
		enc, err := Encode(g)
		if err != nil {
			t.Fatalf("cannot encode a decoded configuration: %v", err)
		}
		h, err := Decode(name, enc)
		if err != nil {
			t.Fatalf("cannot decode its own encoding %q: %v", enc, err)
		}
		if !reflect.DeepEqual(g, h) {
			t.Fatalf("round trip changed the configuration:\n%#v\n%#v", g, h)
		}
		again, err := Encode(h)
		if err != nil || string(again) != string(enc) {
			t.Fatalf("encoding is not stable: %q then %q (%v)", enc, again, err)
		}
	})
}

// FuzzDecodeGatewayStats: the body of a gateway's /stats, bytes from the
// network, either decodes to the record of the model asked for or is an
// error; it never panics.
func FuzzDecodeGatewayStats(f *testing.F) {
	f.Add([]byte(`{"models":{"M":{"model":"M","source":"gateway","requests":10,"hits":7,"decisions":{"affinity":8},"replicas":[{"name":"r0","routed":6,"share":0.6,"healthy":true}]}}}`), "M")
	f.Add([]byte(`{"model":"M","requests":1}`), "M")
	f.Add([]byte(`{"models":null,"model":"M"}`), "M")
	f.Add([]byte(`{"models":{"M":{"replicas":[{"name":"\u001b]0;x\u0007"}]}}}`), "M")
	f.Add([]byte(`null`), "M")
	f.Add([]byte(`{"models":{"M":{"model":"M","index":"exact","replicas":[{"name":"r0","cached_blocks":12}],"kv_events":{"block_size":16,"tokenize":{"requests":5,"engine_calls":3,"errors":1},"fallbacks":{"tokenize_error":1},"engines":[{"endpoint":"tcp://*:5557","topic":"kv@p@M","replicas":["M/r0"],"dropped_by":{"orphan":2},"mapped_blocks":12}],"endpoints":[{"endpoint":"tcp://*:5557","bound":true}]}}}}`), "M")
	f.Add([]byte(`{"models":{"M":{"kv_events":{"engines":{"x":1}}}}}`), "M")
	f.Add([]byte(`{"models":{"M":{"kv_events":null,"index":7}}}`), "M")
	f.Add([]byte(`{"models":{"":{}}}`), "")
	if data, err := os.ReadFile("testdata/stats_document.json"); err == nil {
		f.Add(data, "JPCP")
	}
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		rec, err := DecodeGatewayStats(body, model)
		if err != nil {
			return
		}
		if rec.Model != model || rec.Source == "" {
			t.Fatalf("record for %q has model %q, source %q", model, rec.Model, rec.Source)
		}
	})
}
