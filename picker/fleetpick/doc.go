// Package fleetpick is the endpoint picker's Router over the control
// plane: a picker.Router (package picker serves it to Envoy over ext_proc)
// that routes each request over a *fleet.Fleet's models exactly as the
// HTTP gateway (package httpgw) routes it: the same request parsing and
// keys, LoRA adapters, admission (shedding), decisions, fallbacks, P/D
// plan (sidecar mode), metrics and errors, all shared through
// internal/front. `exa serve picker` builds a Fleet, a Router over it and
// the admin handler (Admin):
//
//	fl, err := fleet.New(fleet.Options{ConfigPath: path, Registerer: reg, Attach: fleetpick.Attach})
//	r, err := fleetpick.New(fl, fleetpick.Options{Registerer: reg})
//	pk, err := picker.New(r, picker.Options{})
//	go fl.Run(ctx) // reloads, probes, scrapes
//
// See docs/picker.md.
//
// Concurrency: New's Router and Admin's handler are safe for concurrent
// use. A pick reads one immutable snapshot of the fleet (fleet.Snapshot)
// from start to end, so a reload never blocks or breaks it; the picker's
// view of each snapshot (the engines' ip:port endpoints) is built once,
// on the first pick after a reload, under a mutex. A picked request's
// Tracker belongs to that request (picker calls it from one goroutine).
package fleetpick
