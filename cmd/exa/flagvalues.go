package main

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
)

// modeValue is a --mode flag: a routing mode name, checked as it is parsed.
type modeValue struct {
	mode gateway.Mode
	set  bool
}

func (v *modeValue) String() string {
	if !v.set {
		return ""
	}
	return v.mode.String()
}

func (v *modeValue) Type() string { return "mode" }

func (v *modeValue) Set(s string) error {
	var m gateway.Mode
	if err := m.UnmarshalText([]byte(s)); err != nil || s == "" {
		return errors.New("want " + modeChoices())
	}
	v.mode, v.set = m, true
	return nil
}

// modeNames lists the routing modes' names, the default first.
func modeNames() []string {
	var names []string
	for _, m := range []gateway.Mode{gateway.ModeRoundRobin, gateway.ModeCacheAware, gateway.ModeLoadAware} {
		names = append(names, m.String())
	}
	return names
}

// modeChoices is modeNames as text: "round_robin, cache_aware or
// load_aware".
func modeChoices() string {
	n := modeNames()
	return strings.Join(n[:len(n)-1], ", ") + " or " + n[len(n)-1]
}

// pdModeValue is --pd-mode: gateway or sidecar.
type pdModeValue struct{ mode string }

func (v *pdModeValue) String() string { return v.mode }
func (v *pdModeValue) Type() string   { return "pd-mode" }
func (v *pdModeValue) Set(s string) error {
	m, err := config.ParsePDMode(s)
	if err != nil || s == "" {
		return errors.New("want gateway or sidecar")
	}
	v.mode = m
	return nil
}

// engineValue is --engine: vllm, sglang, trtllm or auto.
type engineValue struct{ engine string }

func (v *engineValue) String() string {
	if v.engine == config.EngineAuto {
		return "auto"
	}
	return v.engine
}
func (v *engineValue) Type() string { return "engine" }
func (v *engineValue) Set(s string) error {
	e, err := config.ParseEngine(strings.TrimSpace(s))
	if err != nil {
		return errors.New("want vllm, sglang, trtllm or auto")
	}
	v.engine = e
	return nil
}

// tokensValue is --pd-min-uncached-tokens: 0..config.MaxPDMinUncachedTokens.
type tokensValue struct{ n int }

func (v *tokensValue) String() string { return strconv.Itoa(v.n) }
func (v *tokensValue) Type() string   { return "tokens" }
func (v *tokensValue) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 || n > config.MaxPDMinUncachedTokens {
		return fmt.Errorf("want a whole number of tokens from 0 (split every request) to %d", config.MaxPDMinUncachedTokens)
	}
	v.n = n
	return nil
}

// msValue is a non-negative whole number of milliseconds.
type msValue struct{ ms int64 }

func (v *msValue) String() string { return strconv.FormatInt(v.ms, 10) }
func (v *msValue) Type() string   { return "ms" }
func (v *msValue) Set(s string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return errors.New("want a whole number of milliseconds, 0 for none")
	}
	if n < 0 {
		return errors.New("must not be negative")
	}
	v.ms = n
	return nil
}

// weightsValue is --load-weights queue=N,kv=N,latency=N; keys not given
// keep their stored (or default) weight.
type weightsValue struct{ set map[string]float64 }

var weightKeys = []string{"queue", "kv", "latency"}

func (v *weightsValue) String() string {
	var parts []string
	for _, k := range weightKeys {
		if w, ok := v.set[k]; ok {
			parts = append(parts, k+"="+strconv.FormatFloat(w, 'g', -1, 64))
		}
	}
	return strings.Join(parts, ",")
}
func (v *weightsValue) Type() string { return "queue=N,kv=N,latency=N" }
func (v *weightsValue) Set(s string) error {
	if v.set == nil {
		v.set = map[string]float64{}
	}
	for part := range strings.SplitSeq(s, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || !slices.Contains(weightKeys, k) {
			return fmt.Errorf("want KEY=WEIGHT pairs with KEY one of %s, got %q", strings.Join(weightKeys, ", "), part)
		}
		w, err := strconv.ParseFloat(val, 64)
		if err != nil || math.IsNaN(w) || math.IsInf(w, 0) || w < 0 {
			return fmt.Errorf("weight %s=%q must be a finite number, not negative", k, val)
		}
		v.set[k] = w
	}
	return nil
}

// apply merges the given weights into w.
func (v *weightsValue) apply(w *config.LoadWeights) {
	for k, x := range v.set {
		switch k {
		case "queue":
			w.Queue = x
		case "kv":
			w.KV = x
		case "latency":
			w.Latency = x
		}
	}
}

// errReplicaFormat reports a --replica or --pool value without the
// NAME=ADDRESS form.
var errReplicaFormat = errors.New("want NAME=ADDRESS, for example r0=http://10.0.0.1:8000")

// parseReplica parses NAME=ADDRESS and checks the name and the address
// (config.ValidateName, config.ValidateAddress), so that a bad replica is
// refused when the flag is read, not when a request reaches it.
func parseReplica(s string) (config.Replica, error) {
	name, addr, ok := strings.Cut(s, "=")
	name, addr = strings.TrimSpace(name), strings.TrimSpace(addr)
	if !ok || name == "" || addr == "" {
		return config.Replica{}, errReplicaFormat
	}
	var fe *config.FieldError
	if err := config.ValidateName(name); errors.As(err, &fe) {
		return config.Replica{}, fmt.Errorf("name %s", fe.Reason)
	}
	if err := config.ValidateAddress(addr); errors.As(err, &fe) {
		return config.Replica{}, fmt.Errorf("address %s", fe.Reason)
	}
	return config.Replica{Name: name, Address: addr}, nil
}

// replicasValue is a repeatable --replica NAME=ADDRESS.
type replicasValue struct{ list []config.Replica }

func (v *replicasValue) String() string {
	parts := make([]string, len(v.list))
	for i, r := range v.list {
		parts[i] = r.Name + "=" + r.Address
	}
	return strings.Join(parts, ",")
}
func (v *replicasValue) Type() string { return "NAME=ADDRESS" }
func (v *replicasValue) Set(s string) error {
	r, err := parseReplica(s)
	if err != nil {
		return err
	}
	v.list = append(v.list, r)
	return nil
}

// poolsValue is a repeatable --pool POOL:NAME=ADDRESS.
type poolsValue struct{ pools map[string][]config.Replica }

func (v *poolsValue) String() string {
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(v.pools)) {
		for _, r := range v.pools[p] {
			parts = append(parts, p+":"+r.Name+"="+r.Address)
		}
	}
	return strings.Join(parts, ",")
}
func (v *poolsValue) Type() string { return "POOL:NAME=ADDRESS" }
func (v *poolsValue) Set(s string) error {
	errFormat := errors.New("want POOL:NAME=ADDRESS, for example prefill:p0=http://10.0.1.1:8000")
	pool, rest, ok := strings.Cut(s, ":")
	pool = strings.TrimSpace(pool)
	if !ok || pool == "" || strings.Contains(pool, "=") {
		return errFormat
	}
	var fe *config.FieldError
	if err := config.ValidateName(pool); errors.As(err, &fe) {
		return fmt.Errorf("pool name %s", fe.Reason)
	}
	r, err := parseReplica(rest)
	if errors.Is(err, errReplicaFormat) {
		return errFormat
	}
	if err != nil {
		return err
	}
	if v.pools == nil {
		v.pools = map[string][]config.Replica{}
	}
	v.pools[pool] = append(v.pools[pool], r)
	return nil
}
