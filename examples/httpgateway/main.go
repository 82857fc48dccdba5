// Command httpgateway runs the HTTP gateway in-process, cache-aware, in
// front of three fake vLLM engines, and shows the two sides of its job:
//
//  1. Affinity at idle: four chat sessions of three assistants, one request
//     at a time. Each session's turns stay on one engine, which finds the
//     earlier turns cached; the sessions spread over the engines, one
//     engine per assistant's system prompt (two sessions sharing a prompt
//     share its engine: with nothing running, that is where the prompt is
//     cheapest).
//
//  2. Spreading under load: a burst of new sessions of one assistant, each
//     still streaming when the next arrives. One engine holds their shared
//     system prompt, but as its queue grows the load guard (and the
//     replication of a hot prefix) sends the burst to the other engines
//     too, instead of piling it onto the one that holds the prompt.
//
//     go run ./examples/httpgateway
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/httpgw"
	"github.com/examlops/gateway/httpgw/enginetest"
)

func main() {
	if _, err := run(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// The assistants' system prompts.
var assistants = map[string]string{
	"support": "You are the support assistant of Example Corp. Answer in two sentences at most, " +
		"cite the section of the user manual you rely on, and never promise a refund.",
	"coding": "You are a careful Go reviewer. Point out bugs first, then style, and quote the " +
		"lines you mean. Prefer the standard library and say when a test is missing.",
	"travel": "You plan train journeys in Europe. Give departure and arrival times, the number " +
		"of changes and the price class; ask for the date when it is missing.",
}

// sessions are the idle part's chat sessions and the assistant each talks to.
var sessions = []struct{ name, assistant string }{
	{"alice", "support"}, {"carol", "coding"}, {"dave", "travel"}, {"bob", "support"},
}

// burst is how many sessions the loaded part opens at once.
const burst = 12

// result is where the gateway sent each request: engine names by session
// (idle part, one per turn) and by burst request (loaded part).
type result struct {
	Idle  map[string][]string
	Burst []string
}

// run starts the engines and the gateway, plays both parts and prints
// them to w.
func run(w io.Writer) (result, error) {
	res := result{Idle: map[string][]string{}}
	names := []string{"e0", "e1", "e2"}
	var reps []config.Replica
	var engines []*enginetest.Engine
	for _, name := range names {
		e := enginetest.New(enginetest.Options{Name: name, Model: "demo"})
		defer e.Close()
		engines = append(engines, e)
		reps = append(reps, config.Replica{Name: name, Address: e.URL()})
	}
	srv, err := httpgw.New(httpgw.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return res, err
	}
	defer srv.Close()
	// What `exa serve routing set demo --mode cache_aware --replica ...` writes.
	err = srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{
		"demo": {Mode: gateway.ModeCacheAware, Replicas: reps},
	}})
	if err != nil {
		return res, err
	}
	gw := httptest.NewServer(srv)
	defer gw.Close()

	fmt.Fprintln(w, "1. Affinity at idle: one request at a time; each session keeps its engine.")
	history := map[string][]msg{}
	for turn := range 3 {
		for _, s := range sessions {
			h := append(history[s.name], msg{"user", fmt.Sprintf("%s's question %d", s.name, turn)})
			resp, err := chat(gw.URL, s.name, assistants[s.assistant], h, false)
			if err != nil {
				return res, err
			}
			var out struct{ Choices []struct{ Message msg } }
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if err != nil || len(out.Choices) == 0 {
				return res, fmt.Errorf("turn %d of %s: status %d, %v", turn, s.name, resp.StatusCode, err)
			}
			replica := resp.Header.Get(httpgw.HeaderReplica)
			res.Idle[s.name] = append(res.Idle[s.name], replica)
			fmt.Fprintf(w, "   %-5s (%-7s) turn %d -> %s  %s\n", s.name, s.assistant, turn, replica, resp.Header.Get(httpgw.HeaderDecision))
			history[s.name] = append(h, out.Choices[0].Message)
		}
	}
	for _, e := range engines {
		fmt.Fprintf(w, "   %s: %d requests, %d of %d prompt tokens found cached\n", e.Name(), e.Requests(), e.PrefixHits(), e.PrefixQueries())
	}

	fmt.Fprintf(w, "\n2. Spreading under load: %d new %q sessions at once, each still streaming when the next arrives.\n", burst, "support")
	var open []*http.Response
	var release []func()
	for _, e := range engines {
		release = append(release, e.Gate()) // answers pause after their first chunk
	}
	defer func() {
		for _, r := range release {
			r()
		}
		for _, resp := range open {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	for i := range burst {
		session := fmt.Sprintf("user-%02d", i)
		resp, err := chat(gw.URL, session, assistants["support"], []msg{{"user", "Where is my order?"}}, true)
		if err != nil {
			return res, err
		}
		open = append(open, resp)
		if resp.StatusCode != http.StatusOK {
			return res, fmt.Errorf("burst request %d: status %d", i, resp.StatusCode)
		}
		replica := resp.Header.Get(httpgw.HeaderReplica)
		res.Burst = append(res.Burst, replica)
		fmt.Fprintf(w, "   %s -> %s  %s\n", session, replica, resp.Header.Get(httpgw.HeaderDecision))
	}
	var counts []string
	for _, name := range names {
		counts = append(counts, fmt.Sprintf("%s %d", name, countOf(res.Burst, name)))
	}
	fmt.Fprintf(w, "   in flight: %s\n", strings.Join(counts, ", "))
	return res, nil
}

type msg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chat sends one chat request of a session through the gateway. A
// streamed answer's body is left open for the caller.
func chat(url, session, system string, history []msg, stream bool) (*http.Response, error) {
	body, _ := json.Marshal(map[string]any{
		"model":    "demo",
		"messages": append([]msg{{"system", system}}, history...),
		"stream":   stream,
	})
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(httpgw.HeaderSessionID, session)
	return http.DefaultClient.Do(req)
}

func countOf(s []string, v string) int {
	return len(slices.DeleteFunc(slices.Clone(s), func(x string) bool { return x != v }))
}
