// Command httpgateway runs the HTTP gateway in-process in front of three
// fake vLLM engines and sends two chat sessions through it, one request at
// a time, printing where each turn went and how much of its prefix the
// gateway's index matched. With cache-aware routing each turn follows the
// session's earlier turns, so the engine finds their prefix cached; with
// nothing else running, both sessions stay on the engine that holds their
// shared system prompt (under load, the load guard would spread them).
//
//	go run ./examples/httpgateway
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

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/httpgw"
	"github.com/examlops/gateway/httpgw/enginetest"
)

func main() {
	var reps []config.Replica
	var engines []*enginetest.Engine
	for _, name := range []string{"e0", "e1", "e2"} {
		e := enginetest.New(enginetest.Options{Name: name, Model: "demo"})
		defer e.Close()
		engines = append(engines, e)
		reps = append(reps, config.Replica{Name: name, Address: e.URL()})
	}
	srv, err := httpgw.New(httpgw.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	// What `exa serve routing set demo --mode cache_aware --replica ...` writes.
	err = srv.Apply(&config.File{Version: 1, Models: map[string]config.Model{
		"demo": {Mode: gateway.ModeCacheAware, Replicas: reps},
	}})
	if err != nil {
		log.Fatal(err)
	}
	gw := httptest.NewServer(srv)
	defer gw.Close()

	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	history := map[string][]msg{}
	for turn := range 3 {
		for _, session := range []string{"alice", "bob"} {
			h := append(history[session], msg{"user", fmt.Sprintf("%s's question %d", session, turn)})
			body, _ := json.Marshal(map[string]any{
				"model":    "demo",
				"messages": append([]msg{{"system", "You are a terse assistant."}}, h...),
			})
			req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Session-ID", session)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				log.Fatal(err)
			}
			var out struct {
				Choices []struct{ Message msg }
			}
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) == 0 {
				log.Fatalf("turn %d of %s: status %d, %v", turn, session, resp.StatusCode, err)
			}
			resp.Body.Close()
			fmt.Printf("%-5s turn %d -> %s  (%s)\n", session, turn, resp.Header.Get(httpgw.HeaderReplica), resp.Header.Get(httpgw.HeaderDecision))
			history[session] = append(h, out.Choices[0].Message)
		}
	}
	for _, e := range engines {
		fmt.Printf("%s: %d requests, %d of %d prompt tokens found cached\n", e.Name(), e.Requests(), e.PrefixHits(), e.PrefixQueries())
	}
}
