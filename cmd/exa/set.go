package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/spf13/cobra"
)

// setFlags holds the flags of "routing set".
type setFlags struct {
	mode          modeValue
	slo           msValue
	weights       weightsValue
	disaggregate  bool
	prefillPool   string
	decodePool    string
	pdMode        pdModeValue
	pdMinUncached tokensValue
	engine        engineValue
	replicas      replicasValue
	pools         poolsValue
	clearReplicas bool
	removePools   []string
	index         indexValue
	blockSize     blockSizeValue
	kvBind        bindValue
	kvConnect     *perReplicaValue
	kvReplay      *perReplicaValue
	pods          *perReplicaValue
	adapters      []string
	clearAdapters bool
	peers         []string
	clearPeers    bool
	kvAllow       []string
	clearKVAllow  bool
}

func newSetCmd() *cobra.Command {
	sf := setFlags{kvConnect: newConnectValue(), kvReplay: newConnectValue(), pods: newPodValue()}
	cmd := &cobra.Command{
		Use:   "set MODEL [flags]",
		Short: "Store a model's routing configuration (flags not given are left as they are)",
		Long: `Store a model's routing configuration.

Only the fields whose flags are given change; the rest keep their stored values
(or the defaults for a new model: round_robin, no SLO, default load weights,
no disaggregation, no replicas). The file is rewritten atomically under a lock,
so concurrent "set" commands never lose each other's changes.

Running gateways and pickers (exa serve gateway, exa serve picker) on the file reload
it within their --reload-interval; set waits up to 3s for them, and exits 1 when one
of them could not apply the change (for example a --kv-events-bind endpoint that
another process already listens on), naming the process and the reason. The file
keeps the change; the process keeps its previous configuration until it is fixed.`,
		Example: `  # Opt a model into cache-aware routing with a latency SLO:
  exa serve routing set JPCP --mode cache_aware --slo-latency-ms 500
  # Enable prefill/decode disaggregation:
  exa serve routing set JPCP --disaggregate --prefill-pool prefill --decode-pool decode
  # Split only prompts with at least 2000 tokens not cached on the decode replica,
  # for decode replicas behind llm-d's pd-sidecar:
  exa serve routing set JPCP --pd-min-uncached-tokens 2000 --pd-mode sidecar
  # Engines are SGLang servers: read their load from sglang:num_queue_reqs etc.
  # (default auto: detected from each engine's /metrics, vLLM's names first):
  exa serve routing set JPCP --engine sglang
  # Name the replicas the HTTP gateway proxies to:
  exa serve routing set JPCP --replica r0=http://10.0.0.1:8000 --replica r1=http://10.0.0.2:8000
  # Fill the pools:
  exa serve routing set JPCP --pool prefill:p0=http://10.0.1.1:8000 --pool decode:d0=http://10.0.2.1:8000
  # Route on the engines' own KV events, the gateway connecting to each engine's publisher
  # (recommended: no listener; vLLM binds tcp://*:5557):
  exa serve routing set JPCP --mode cache_aware --index exact \
    --kv-events-connect r0=tcp://10.0.0.1:5557 --kv-events-connect r1=tcp://10.0.0.2:5557
  # ... and fetch events lost in a sequence gap from each engine's replay endpoint
  # (vLLM's "replay_endpoint":"tcp://*:5558" in --kv-events-config; on the engine's host):
  exa serve routing set JPCP --kv-events-replay r0=tcp://10.0.0.1:5558 --kv-events-replay r1=tcp://10.0.0.2:5558
  # ... or engines publishing to the gateway (llm-d-inference-sim, POD_IP=10.0.0.1:8000 and
  # --zmq-endpoint tcp://10.0.0.100:5557), the gateway listening on its address 10.0.0.100 only;
  # events are taken only from the replicas' hosts (docs/kv-events.md, Security):
  exa serve routing set JPCP --mode cache_aware --index exact --kv-events-bind tcp://10.0.0.100:5557
  # A disaggregated model on the exact index: every prefill and decode engine publishes events:
  exa serve routing set JPCP --index exact --kv-events-connect prefill:p0=tcp://10.0.1.1:5557 \
    --kv-events-connect decode:d0=tcp://10.0.2.1:5557
  # Serve only these LoRA adapters of the model (by default every adapter its engines list):
  exa serve routing set JPCP --adapter sql-lora --adapter support-lora
  # Several gateways routing the model: each adds the prefill the others report pending
  # (their /metrics) to its own; on gateway A, name B and C:
  exa serve routing set JPCP --peer http://gw-b:8080 --peer http://gw-c:8080`,
		Args:              modelArg,
		ValidArgsFunction: completeModels,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSet(cmd, args[0], &sf)
		},
	}
	f := cmd.Flags()
	f.Var(&sf.mode, "mode", "routing mode: "+modeChoices()+" (default "+gateway.ModeRoundRobin.String()+")")
	f.Var(&sf.slo, "slo-latency-ms", "latency SLO in milliseconds; replicas slower than this are avoided (0 = none)")
	f.Var(&sf.weights, "load-weights", fmt.Sprintf("load-aware weights, e.g. queue=1,kv=0.5,latency=0.25 (defaults queue=%g,kv=%g,latency=%g)",
		gateway.DefaultLoadWeights().Queue, gateway.DefaultLoadWeights().KV, gateway.DefaultLoadWeights().Latency))
	f.BoolVar(&sf.disaggregate, "disaggregate", false, "route prefill and decode to separate pools (--disaggregate=false to switch off)")
	f.StringVar(&sf.prefillPool, "prefill-pool", "", "name of the prefill pool (requires --disaggregate; default \""+config.DefaultPrefillPool+"\")")
	f.StringVar(&sf.decodePool, "decode-pool", "", "name of the decode pool (requires --disaggregate; default \""+config.DefaultDecodePool+"\")")
	f.Var(&sf.pdMode, "pd-mode", "how the gateway splits requests (requires --disaggregate): gateway (default: it sends the prefill and decode requests) or sidecar (decode replicas run llm-d's pd-sidecar)")
	f.Var(&sf.pdMinUncached, "pd-min-uncached-tokens", fmt.Sprintf("split a request only when at least this many prompt tokens are not cached on its decode replica (requires --disaggregate; default %d; 0 splits every request)", config.DefaultPDMinUncachedTokens))
	f.Var(&sf.engine, "engine", "the engines' type, whose /metrics names the gateway reads for their load: vllm, sglang, trtllm, or auto "+
		"(default: detected from each engine's metrics page, vLLM's names first; a page with none is warned about)")
	f.Var(&sf.replicas, "replica", "replica NAME=ADDRESS; repeat for several; replaces the stored replica list")
	f.Var(&sf.pools, "pool", "pool member POOL:NAME=ADDRESS; repeat for several; replaces the members of each pool named")
	f.BoolVar(&sf.clearReplicas, "clear-replicas", false, "remove all replicas (not pools)")
	f.StringSliceVar(&sf.removePools, "remove-pool", nil, "remove the named pool; repeat for several")
	f.Var(&sf.index, "index", "cache index: approximate (the gateway infers what engines cache from its own routing; default) or exact "+
		"(follows the engines' KV events, tokenizes requests on the engines; needs --mode cache_aware unless --disaggregate, and an event source "+
		"for every replica, and every prefill and decode pool member of a disaggregated model: --kv-events-bind or --kv-events-connect)")
	f.Var(&sf.blockSize, "block-size", fmt.Sprintf("the engines' KV block size in tokens, for the exact index (vLLM's --block-size; 0 = %d)", config.DefaultBlockSize))
	f.Var(&sf.kvBind, "kv-events-bind", "ZMQ endpoint the gateway listens on for KV events, tcp://HOST:PORT (engines whose publisher connects, "+
		"e.g. llm-d-inference-sim --zmq-endpoint; their topic kv@POD@MODEL names them, and their connection must come from the replica's host); "+
		"HOST is the address to listen on, not 0.0.0.0 unless every network it reaches may publish; \"\" to clear")
	f.Var(sf.kvConnect, "kv-events-connect", "replica NAME's KV-event publisher to connect to, NAME=tcp://HOST:PORT (vLLM binds tcp://*:5557); "+
		"NAME may be POOL:NAME, a pool member; repeat for several; an empty endpoint clears it")
	f.Var(sf.kvReplay, "kv-events-replay", "replica NAME's KV-event replay endpoint to fetch events lost in a sequence gap from, NAME=tcp://HOST:PORT "+
		"(vLLM's replay_endpoint in --kv-events-config); HOST must be the engine's: the host of its --kv-events-connect endpoint, else of its address; "+
		"ipc://PATH only with an ipc:// --kv-events-connect; NAME may be POOL:NAME, a pool member; repeat for several; an empty endpoint clears it")
	f.Var(sf.pods, "pod", "the pod name replica NAME's engine gives in its topics (kv@POD@MODEL; POD_IP), NAME=POD; default its address's host:port, "+
		"or its host alone; NAME may be POOL:NAME, a pool member; repeat for several; empty clears it")
	f.StringArrayVar(&sf.adapters, "adapter", nil, "LoRA adapter NAME the model may serve; repeat for several; replaces the stored allow-list "+
		"(without one, every adapter the model's engines list in GET /v1/models is served)")
	f.BoolVar(&sf.clearAdapters, "clear-adapters", false, "remove the adapter allow-list: serve every adapter the engines list")
	f.StringArrayVar(&sf.peers, "peer", nil, "base URL of another gateway process routing this model to the same replicas, whose /metrics reports the prefill it has pending "+
		"at each (cache_aware adds it to this gateway's own), or dns+http://NAME:PORT for every address NAME resolves to (a headless Service; dns+https:// verifies each address's certificate for NAME); "+
		"a gateway that finds itself among its peers ignores itself; repeat for several; replaces the stored peer list")
	f.BoolVar(&sf.clearPeers, "clear-peers", false, "remove the peer list: count only the prefill this gateway routed")
	f.StringArrayVar(&sf.kvAllow, "kv-events-allow", nil, "source address (IP or CIDR prefix) that may publish KV events on --kv-events-bind besides the replicas' hosts, "+
		"under any topic (a relay, NAT); repeat for several; replaces the stored list")
	f.BoolVar(&sf.clearKVAllow, "clear-kv-events-allow", false, "remove the --kv-events-allow list: take events only from the replicas' hosts")
	_ = cmd.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions(modeNames(), cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("pd-mode", cobra.FixedCompletions(config.PDModes, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("engine", cobra.FixedCompletions(append([]string{"auto"}, config.Engines...), cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("index", cobra.FixedCompletions(config.Indexes, cobra.ShellCompDirectiveNoFileComp))
	for _, name := range []string{"slo-latency-ms", "load-weights", "prefill-pool", "decode-pool", "pd-min-uncached-tokens", "replica", "pool", "remove-pool",
		"block-size", "kv-events-bind", "kv-events-connect", "kv-events-replay", "pod", "adapter", "peer", "kv-events-allow"} {
		_ = cmd.RegisterFlagCompletionFunc(name, cobra.NoFileCompletions)
	}
	return cmd
}

// runSet applies the given flags to the stored model under the file lock.
func runSet(cmd *cobra.Command, name string, sf *setFlags) error {
	path, err := configPath()
	if err != nil {
		return err
	}
	changed := cmd.Flags().Changed
	if err := exclusive(cmd, [][2]string{{"replica", "clear-replicas"}, {"adapter", "clear-adapters"}, {"peer", "clear-peers"}, {"kv-events-allow", "clear-kv-events-allow"}}); err != nil {
		return err
	}
	for _, flag := range []struct{ name, value string }{{"prefill-pool", sf.prefillPool}, {"decode-pool", sf.decodePool}} {
		if changed(flag.name) && strings.TrimSpace(flag.value) == "" {
			return usagef("invalid --%s %q: must not be empty", flag.name, flag.value)
		}
	}
	for _, p := range sf.removePools {
		if _, ok := sf.pools.pools[p]; ok {
			return usagef("invalid --remove-pool %q: the same command also sets its members with --pool", p)
		}
	}
	var stored config.Model
	err = config.Update(path, func(f *config.File) error {
		m := f.Models[name].Clone()
		if changed("mode") {
			m.Mode = sf.mode.mode
		}
		if changed("slo-latency-ms") {
			m.SLOLatencyMS = sf.slo.ms
		}
		if changed("load-weights") {
			w := config.LoadWeights(gateway.DefaultLoadWeights())
			if m.LoadWeights != nil {
				w = *m.LoadWeights
			}
			sf.weights.apply(&w)
			m.LoadWeights = &w
		}
		if changed("disaggregate") {
			m.Disaggregate = sf.disaggregate
		}
		for _, flag := range []struct {
			name, value string
			field       *string
		}{{"prefill-pool", sf.prefillPool, &m.PrefillPool}, {"decode-pool", sf.decodePool, &m.DecodePool}} {
			if !changed(flag.name) {
				continue
			}
			if !m.Disaggregate {
				return usagef("--%s %q requires --disaggregate (model %q is not disaggregated)", flag.name, flag.value, name)
			}
			*flag.field = flag.value
		}
		for _, flag := range []struct{ name, value string }{{"pd-mode", sf.pdMode.mode}, {"pd-min-uncached-tokens", sf.pdMinUncached.String()}} {
			if changed(flag.name) && !m.Disaggregate {
				return usagef("--%s %s requires --disaggregate (model %q is not disaggregated)", flag.name, flag.value, name)
			}
		}
		if changed("pd-mode") {
			m.PDMode = sf.pdMode.mode
		}
		if changed("pd-min-uncached-tokens") {
			n := sf.pdMinUncached.n
			m.PDMinUncachedTokens = &n
		}
		if m.Disaggregate {
			if m.PrefillPool == "" {
				m.PrefillPool = config.DefaultPrefillPool
			}
			if m.DecodePool == "" {
				m.DecodePool = config.DefaultDecodePool
			}
		}
		if sf.clearReplicas {
			m.Replicas = nil
		}
		if changed("replica") {
			m.Replicas = keepEventSources(sf.replicas.list, m.Replicas)
		}
		if changed("index") {
			m.Index = sf.index.index
		}
		if changed("engine") {
			m.Engine = sf.engine.engine
		}
		if changed("block-size") {
			m.BlockSize = sf.blockSize.n
		}
		if changed("kv-events-bind") {
			m.KVEventsBind = sf.kvBind.ep
		}
		if sf.clearAdapters {
			m.Adapters = nil
		}
		if changed("adapter") {
			m.Adapters = slices.Clone(sf.adapters)
		}
		if sf.clearPeers {
			m.Peers = nil
		}
		if changed("peer") {
			m.Peers = slices.Clone(sf.peers)
		}
		if sf.clearKVAllow {
			m.KVEventsAllow = nil
		}
		if changed("kv-events-allow") {
			m.KVEventsAllow = slices.Clone(sf.kvAllow)
		}
		for _, p := range sf.removePools {
			if _, ok := m.Pools[p]; !ok {
				return usagef("invalid --remove-pool %q: model %q has no such pool", p, name)
			}
			delete(m.Pools, p)
		}
		for p, rs := range sf.pools.pools {
			if m.Pools == nil {
				m.Pools = map[string][]config.Replica{}
			}
			m.Pools[p] = keepEventSources(rs, m.Pools[p])
		}
		if len(m.Pools) == 0 {
			m.Pools = nil
		}
		if err := sf.kvConnect.apply("kv-events-connect", name, m.Replicas, m.Pools, func(r *config.Replica) *string { return &r.KVEvents }); err != nil {
			return err
		}
		if err := sf.kvReplay.apply("kv-events-replay", name, m.Replicas, m.Pools, func(r *config.Replica) *string { return &r.KVEventsReplay }); err != nil {
			return err
		}
		if err := sf.pods.apply("pod", name, m.Replicas, m.Pools, func(r *config.Replica) *string { return &r.Pod }); err != nil {
			return err
		}
		if err := m.Validate(); err != nil {
			return modelFieldError(err)
		}
		f.Models[name] = m
		stored = m
		return nil
	})
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "saved %s in %s\n", name, path)
	describe(out, name, stored)
	// The running gateways and pickers reload the file within their
	// --reload-interval; one that cannot apply it fails the command.
	pending, err := waitReloads(path, reloadWait, time.Sleep)
	if err != nil {
		return fmt.Errorf("saved %s in %s, but %w", name, path, err)
	}
	for _, p := range pending {
		fmt.Fprintf(cmd.ErrOrStderr(), "note: exa serve %s (pid %d) has not loaded the change within %v (its --reload-interval may be longer)\n", p.Command, p.PID, reloadWait)
	}
	return nil
}

// flagOfField names the set flag that controls a config field.
var flagOfField = map[string]string{
	"mode":                   "mode",
	"slo_latency_ms":         "slo-latency-ms",
	"load_weights":           "load-weights",
	"prefill_pool":           "prefill-pool",
	"decode_pool":            "decode-pool",
	"pd_mode":                "pd-mode",
	"pd_min_uncached_tokens": "pd-min-uncached-tokens",
	"replicas":               "replica",
	"pools":                  "pool",
	"pool":                   "pool",
	"index":                  "index",
	"engine":                 "engine",
	"block_size":             "block-size",
	"kv_events_bind":         "kv-events-bind",
	"adapters":               "adapter",
	"peers":                  "peer",
	"kv_events_allow":        "kv-events-allow",
}

// flagOfReplicaField names the set flag that controls a replica's field
// (replicas[i].kv_events), when it is not --replica.
var flagOfReplicaField = map[string]string{"kv_events": "kv-events-connect", "kv_events_replay": "kv-events-replay", "pod": "pod"}

// keepEventSources returns the replicas of a --replica (or one pool's
// --pool) list, each keeping
// the kv_events, kv_events_replay and pod stored for its name.
func keepEventSources(list, stored []config.Replica) []config.Replica {
	out := make([]config.Replica, len(list))
	for i, r := range list {
		if j := indexOfReplica(stored, r.Name); j >= 0 {
			r.KVEvents, r.KVEventsReplay, r.Pod = stored[j].KVEvents, stored[j].KVEventsReplay, stored[j].Pod
		}
		out[i] = r
	}
	return out
}

// modelFieldError turns a Model.Validate error into a usage error naming
// the flag, the field and the value.
func modelFieldError(err error) error {
	var fe *config.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	head := fe.Field
	if i := strings.IndexAny(head, ".["); i >= 0 {
		head = head[:i]
	}
	if i := strings.LastIndexByte(fe.Field, '.'); i >= 0 && (head == "replicas" || head == "pools") {
		if flag, ok := flagOfReplicaField[fe.Field[i+1:]]; ok {
			return usagef("invalid --%s: %s %q: %s", flag, fe.Field, fe.Value, fe.Reason)
		}
	}
	if flag, ok := flagOfField[head]; ok {
		return usagef("invalid --%s: %s %q: %s", flag, fe.Field, fe.Value, fe.Reason)
	}
	return &usageError{err}
}
