// Package httpgw is the data plane of the OpenAI-compatible HTTP gateway:
// for each request it admits, keys, decides (calls into the routing
// library github.com/examlops/gateway), forwards and retries, and relays
// the answer; it executes prefill/decode disaggregation, passes
// /v1/embeddings, /tokenize and /detokenize through, and sends the
// requests about a stored response (/v1/responses/{id}) to the engine
// that stored it. `exa serve gateway`
// runs it; other Go servers can mount a *Server as an http.Handler.
//
//	srv, err := httpgw.New(httpgw.Options{Fleet: fleet.Options{ConfigPath: "/etc/exa/routing.json"}})
//	if err != nil { ... }
//	go srv.Run(ctx) // reloads, /health probes, /metrics scrapes
//	http.ListenAndServe("127.0.0.1:8080", srv)
//
// The control plane (configuration apply and reload, probes and outlier
// ejection, load scrapes, LoRA and model discovery, KV-event wiring, peer
// gateways, /stats) is package fleet: a Server embeds a *fleet.Fleet, whose
// Apply, Reload, Run, ProbeAll, ScrapeAll and Stats are the Server's, and
// reads its snapshot for each request; the data plane reports what
// engines answer (passive health) back through it. The endpoint picker's
// Router (package picker/fleetpick, `exa serve picker`) is the other data
// plane over a fleet; what the two do alike (request metrics, OpenAI
// errors, parsing and keys, the P/D plan's bookkeeping, decision headers,
// /v1/models, /stats, /metrics) is package internal/front, which both
// import.
//
// Reference: docs/gateway.md (endpoints, non-streamed requests, configuration, disaggregation,
// keys, exact index, engine signals, LoRA, failures), docs/metrics.md
// (every metric) and docs/stats.md (the GET /stats schema).
//
// Concurrency: every method of Server is safe for concurrent use. Requests read an immutable snapshot of the configuration and
// engines (replaced whole by Apply), so a reload never blocks a request;
// per-request state lives on the request's goroutine.
package httpgw
