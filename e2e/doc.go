// Package e2e holds the end-to-end tests of the HTTP gateway against real
// engine processes (llm-d's vLLM simulator, pinned in ../tools) and the
// real exa binary. They are behind the e2e build tag so that
// `go test ./...` stays fast; run them with e2e/run.sh, which builds both
// binaries and runs `go test -tags e2e ./e2e/`.
//
// Everything listens on 127.0.0.1. The engines run with
// POD_IP=127.0.0.1 (their KV cache needs it), --enable-kvcache with
// 16-token blocks, a per-token prefill time and the dummy tokenizer (no
// network); `exa serve routing set` writes the gateway's configuration and
// `exa serve gateway` serves it.
//
//   - TestCacheAwareBeatsRoundRobin: a shared-prefix workload (24 system
//     prompts, 8 concurrent clients) in round_robin, then on restarted
//     engines in cache_aware; compares the engines' vllm:prefix_cache_hits
//     and the clients' times to first token, and reads the live figures
//     with `exa serve routing stats --gateway`.
//   - TestEngineKilledMidRun: one engine is killed (SIGKILL) during a run;
//     every request gets an answer or a clear error, the engine is
//     ejected, and after a restart it is readmitted and served again.
//   - TestMultiTurnSessions: multi-turn chats resending their history;
//     cache-aware routing keeps each on the engine holding its earlier
//     turns.
//   - TestKV* (kvevents_test.go): the kvevents library against engines
//     publishing KV events: exact predictions in both encodings,
//     evictions, restarts, two gateways through a relay, tokenize latency.
//   - TestKVGateway* (kvgateway_test.go): the exact index through
//     `exa serve gateway`: predicted cached tokens against the engines'
//     cached_tokens, two gateways taking turns (exact against
//     approximate), an engine killed and restarted, the latency added by
//     tokenization. Figures in docs/kv-events.md.
//   - TestPicker (picker_test.go): `exa serve picker` over three engines.
//     No Envoy binary exists here: pickertest.Envoy, a Go ext_proc client,
//     plays Envoy's message sequence, sends each request to the engine
//     picked and feeds the response back. Affinity, subset hints, 503 and
//     404, bodies over 62 KB, client cancellation, 429 shedding, the
//     fallback list with passive ejection.
//   - TestAddedLatency: direct, through the gateway and through a bare
//     httputil.ReverseProxy, taking turns at a steady rate; logs p50, p90
//     and p99 (EXA_E2E_LATENCY_N, EXA_E2E_LATENCY_RATE tune it).
//   - TestKubernetesPicker (k8s_test.go): a real kube-apiserver and etcd
//     (envtest; e2e/k8s/install.sh) with GIE's InferencePool CRD; `exa
//     serve picker --pool-name` and `exa serve gateway --pool-name`
//     follow pods created, made unready and deleted while requests flow
//     through both: none may fail. Pod IPs are loopback addresses relayed
//     to the engines. Then a picker started with GIE's chart arguments.
//     Skips when the control plane binaries are absent.
//   - TestGIESideBySide (gie_side_test.go): the same workload through
//     GIE's own endpoint picker v1.5.0 and `exa serve picker`, each
//     discovering the same pool; engines' prefix-cache hits and TTFT per
//     picker (docs/results.md). Skips without GIE's epp
//     (e2e/k8s/install-gie-epp.sh).
//   - TestSpeedsGateway, TestSpeedsPicker (speed_test.go): a fast and a
//     3x slower engine, distinct prompts, cache-aware: after a warm-up the
//     front that learns the replicas' speeds sends the fast engine at
//     least 85% of the requests; through the picker a non-streamed
//     request's pending prefill is released at its predicted first token.
//     EXA_E2E_SPEED_BASELINE_EXA runs another build beside it
//     (docs/picker.md, "Learned speeds").
//   - TestPickerUpstreamStream (picker_upstream_test.go): through the
//     picker, a "stream": false request's pending prefill is released at
//     its first token, long before its answer ends, as the gateway's
//     TestNonStreamedFirstToken; with --upstream-stream=false only at the
//     end. TestPickerUpstreamLatency: what --upstream-stream adds to a
//     small non-streamed request (docs/picker.md, "Non-streamed answers").
//
// run.sh reads EXA_E2E_BIN (where to put the binaries, default
// $TMPDIR/exa-e2e-bin); the tests read EXA_E2E_SIM and EXA_E2E_EXA, which
// run.sh sets.
package e2e
