// Package fleet is the control plane of the HTTP gateway and the endpoint
// picker: it turns a routing configuration (package config) and what the
// engines say about themselves into an immutable State that the data
// planes read.
//
// A Fleet applies a configuration (Apply, or Reload of Options.ConfigPath)
// by building every model's routing table (a gateway.Gateway per model,
// or a decode and a prefill gateway for a disaggregated one) and
// publishing it whole; Run keeps it current: /health probes and outlier
// ejection (Health; data planes report the answers they get with
// Endpoint.Health and Observe), /metrics load scrapes with the engine
// type's series names, LoRA adapter and model discovery (GET /v1/models),
// the exact index's KV events (kvevents; listening and connecting as the
// configuration says) and the peer gateways' pending prefill. Stats is the
// GET /stats document (docs/stats.md).
//
// The data planes read it: httpgw.Server embeds a *Fleet (`exa serve
// gateway`), and the endpoint picker's fleetpick.Router is built over one
// (`exa serve picker` builds a Fleet, the Router and its admin handler,
// and no httpgw.Server); Kubernetes discovery (package k8s) applies its
// replicas to either through Apply.
//
// Concurrency: all methods are safe for concurrent use. Apply, reloads and
// health transitions are serialised by one mutex; Snapshot is a lock-free
// atomic load, and a State is never modified once published, except for
// what is documented as shared (an Endpoint's health and load, the
// counters), which carries its own synchronisation. A request reads one
// snapshot from start to end, so a reload never blocks or breaks it.
package fleet
