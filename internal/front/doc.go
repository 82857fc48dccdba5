// Package front holds what the two data planes share, so that the HTTP
// gateway (package httpgw) and the endpoint picker's Router (package
// picker/fleetpick) key, count, describe and refuse a request alike: the
// request metrics (exa_gateway_*) and their label conventions, the OpenAI
// error object, request parsing and keying (the approximate key and the
// exact index's, tokenization included), the P/D plan's bookkeeping, the
// decision headers (X-Exa-Replica, X-Exa-Decision and the P/D ones), the
// latency objectives (x-slo-ttft-ms, x-slo-tpot-ms, per-model defaults
// and the best-effort-or-429 rule, Objectives.Refuse), the output-token
// meter of a relayed answer (Meter), and the /v1/models, /stats and
// /metrics answers. Both fronts read the
// control plane (package fleet); neither decides anything itself: the
// decisions are the library's (gateway.Gateway.RouteWith, Saturated,
// Spares; gateway.PD.Route).
//
// Concurrency: every exported function and method is safe for concurrent
// use, but for a Meter's (one per answer); Metrics and Keyer are shared
// by all requests once built.
package front
