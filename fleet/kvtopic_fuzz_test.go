package fleet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/kvevents"
	"github.com/prometheus/client_golang/prometheus"
)

// FuzzAcceptTopic: the topic of a KV-event subscription is bytes from
// whoever connected. kvPolicy.AcceptTopic never panics; it lets a host
// publish only the topics of the engines on that host (a replica named
// by IP, so the host is the topic pod's address), and a refusal names
// the topic. The Translator's resolver never panics on it either.
func FuzzAcceptTopic(f *testing.F) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Registerer: reg, Logger: quietLogger()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = s.Close() })
	bind := freeTCP(f)
	if err := s.Apply(&config.File{Version: 1, Models: map[string]config.Model{testModel: {
		Mode: gateway.ModeCacheAware, Index: config.IndexExact, KVEventsBind: bind,
		Replicas: []config.Replica{{Name: "a", Address: "http://10.0.0.1:8000"}, {Name: "b", Address: "http://10.0.0.2:8000"},
			{Name: "c", Address: "http://[fd00::3]:8000"}}}}}); err != nil {
		f.Fatal(err)
	}
	p := kvPolicy{s: s, lookup: func(context.Context, string) ([]netip.Addr, error) {
		return nil, fmt.Errorf("no lookups: every replica is named by IP")
	}}
	for _, tc := range []struct{ topic, remote string }{
		{"kv@10.0.0.1:8000@" + testModel, "10.0.0.1"},
		{"kv@10.0.0.1@" + testModel, "10.0.0.1"},
		{"kv@10.0.0.1:8000@" + testModel, "10.0.0.2"},
		{"kv@[fd00::3]:8000@" + testModel, "fd00::3"},
		{"kv@fd00::3@" + testModel, "::ffff:10.0.0.1"},
		{"kv@a@" + testModel, "10.0.0.1"},
		{"", "10.0.0.1"},
		{"vllm-free-topic", "10.0.0.2"},
		{"kv@10.0.0.2:8000@other", "10.0.0.2"},
	} {
		f.Add([]byte(tc.topic), tc.remote)
	}
	f.Fuzz(func(t *testing.T, topic []byte, remoteText string) {
		remote, err := netip.ParseAddr(remoteText)
		if err != nil {
			return
		}
		src := kvevents.Source{Endpoint: bind, Topic: string(topic)}
		src.Pod, src.Model, _ = kvevents.ParseTopic(src.Topic)
		_, _ = s.resolveKV(src)
		err = p.AcceptTopic(bind, remote, topic)
		if err != nil {
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", string(topic))) {
				t.Fatalf("refusal of topic %q does not name it: %v", topic, err)
			}
			return
		}
		host := src.Pod
		if h, _, err := net.SplitHostPort(src.Pod); err == nil {
			host = h
		}
		a, err := netip.ParseAddr(host)
		if err != nil || a.Unmap() != remote.Unmap() {
			t.Fatalf("topic %q (pod %q) accepted from %s", topic, src.Pod, remote)
		}
	})
}
