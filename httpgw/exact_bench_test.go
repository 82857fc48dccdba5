package httpgw

import (
	"context"
	"strings"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/front"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/kvevents"
)

// BenchmarkExactKey measures keying a chat of a 16 KiB system prompt on
// the exact index when its tokens are in the gateway's cache (the
// in-process part of the exact path: reading the body's messages, the
// cache lookup, the timeout context, the chained token key), beside
// BenchmarkParseAndKey's approximate key of the same body. A cache miss
// adds a /tokenize round trip (e2e TestKVGatewayLatency).
func BenchmarkExactKey(b *testing.B) {
	sys := strings.Repeat("You are a helpful assistant for the ACME corporation. ", 300)
	body := []byte(chatBody("m1", false, sys, "first question about the contract terms?", "an answer that is fairly long and detailed", "a follow-up question"))
	s, err := New(Options{Logger: quietLogger(), Fleet: fleet.Options{Tokenizer: kvevents.NewCachedTokenizer(&wordTokenizer{}, kvevents.CacheOptions{})}})
	if err != nil {
		b.Fatal(err)
	}
	cfg := config.Model{Mode: gateway.ModeCacheAware, Index: config.IndexExact, KVEventsBind: "ipc://" + b.TempDir() + "/kv",
		Replicas: []config.Replica{{Name: "r0", Address: "http://127.0.0.1:1"}}}
	if err := s.Apply(&config.File{Version: 1, Models: map[string]config.Model{"m1": cfg}}); err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	req, err := parseRequest(endpointChat, body)
	if err != nil {
		b.Fatal(err)
	}
	ms, in := s.Snapshot().Models["m1"], front.Input{Kind: keys.Chat, Body: body, Req: req}
	ctx := context.Background()
	key := make(gateway.Key, 0, 512)
	if key, fb := s.keyer.Key(ctx, key[:0], ms, in); fb >= 0 || len(key) == 0 {
		b.Fatalf("fell back (%d) or empty key", fb)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		key, _ = s.keyer.Key(ctx, key[:0], ms, in)
	}
}
