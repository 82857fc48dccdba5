package kvevents

import (
	"strings"
	"testing"
)

// FuzzParseTopic: a ZMQ topic is bytes from the network. ParseTopic never
// panics; when it accepts a topic, the pod and model are not empty, hold
// no '@', and put back together they spell the topic exactly.
func FuzzParseTopic(f *testing.F) {
	for _, s := range []string{
		"kv@10.0.0.1@llama", "kv@pod-a@meta-llama/Llama-3.1-8B", "kv@[fd00::1]:8000@m",
		"", "kv@", "kv@pod", "kv@@m", "kv@p@", "kv@p@m@x", "xx@p@m", "KV@p@m", "kv@p\x00@m\xff",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		pod, model, ok := ParseTopic(topic)
		if !ok {
			if pod != "" || model != "" {
				t.Fatalf("refused %q but returned pod %q, model %q", topic, pod, model)
			}
			return
		}
		if pod == "" || model == "" || strings.Contains(pod, "@") || strings.Contains(model, "@") {
			t.Fatalf("accepted %q as pod %q, model %q", topic, pod, model)
		}
		if got := "kv@" + pod + "@" + model; got != topic {
			t.Fatalf("accepted %q as pod %q, model %q, which spell %q", topic, pod, model, got)
		}
	})
}
