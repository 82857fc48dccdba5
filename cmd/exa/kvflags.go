package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/examlops/gateway/config"
)

// Flags of "routing set" for the exact index.

// indexValue is --index: approximate or exact.
type indexValue struct{ index string }

func (v *indexValue) String() string { return v.index }
func (v *indexValue) Type() string   { return "index" }
func (v *indexValue) Set(s string) error {
	i, err := config.ParseIndex(s)
	if err != nil || s == "" {
		return errors.New("want approximate or exact")
	}
	v.index = i
	return nil
}

// blockSizeValue is --block-size: tokens per KV block, 0 for the default.
type blockSizeValue struct{ n int }

func (v *blockSizeValue) String() string { return strconv.Itoa(v.n) }
func (v *blockSizeValue) Type() string   { return "tokens" }
func (v *blockSizeValue) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 || n > config.MaxBlockSize {
		return fmt.Errorf("want a whole number of tokens in 0..%d (0 means %d)", config.MaxBlockSize, config.DefaultBlockSize)
	}
	v.n = n
	return nil
}

// bindValue is --kv-events-bind: an endpoint to listen on, "" to clear.
type bindValue struct{ ep string }

func (v *bindValue) String() string { return v.ep }
func (v *bindValue) Type() string   { return "tcp://HOST:PORT" }
func (v *bindValue) Set(s string) error {
	s = strings.TrimSpace(s)
	if s != "" {
		var fe *config.FieldError
		if err := config.ValidateKVEndpoint(s, true); errors.As(err, &fe) {
			return errors.New(fe.Reason)
		}
	}
	v.ep = s
	return nil
}

// perReplicaValue is a repeatable NAME=VALUE flag setting one field of
// named replicas; an empty VALUE clears it.
type perReplicaValue struct {
	what  string // VALUE's name in the flag type
	check func(string) error
	set   map[string]string
	order []string
}

func (v *perReplicaValue) String() string {
	parts := make([]string, len(v.order))
	for i, n := range v.order {
		parts[i] = n + "=" + v.set[n]
	}
	return strings.Join(parts, ",")
}
func (v *perReplicaValue) Type() string { return "NAME=" + v.what }
func (v *perReplicaValue) Set(s string) error {
	name, val, ok := strings.Cut(s, "=")
	name, val = strings.TrimSpace(name), strings.TrimSpace(val)
	if !ok || name == "" {
		return fmt.Errorf("want NAME=%s (an empty %s clears it)", v.what, v.what)
	}
	if val != "" {
		var fe *config.FieldError
		if err := v.check(val); errors.As(err, &fe) {
			return fmt.Errorf("%s %s", strings.ToLower(v.what), fe.Reason)
		}
	}
	if v.set == nil {
		v.set = map[string]string{}
	}
	if _, dup := v.set[name]; !dup {
		v.order = append(v.order, name)
	}
	v.set[name] = val
	return nil
}

// apply sets field of each named replica: a replica of rs, or else, for a
// name POOL:NAME, member NAME of pool POOL (a disaggregated model's
// engines); a name that is neither is a usage error naming the flag.
func (v *perReplicaValue) apply(flag, model string, rs []config.Replica, pools map[string][]config.Replica, field func(*config.Replica) *string) error {
	for _, name := range v.order {
		if i := indexOfReplica(rs, name); i >= 0 {
			*field(&rs[i]) = v.set[name]
			continue
		}
		if pool, member, ok := strings.Cut(name, ":"); ok {
			if i := indexOfReplica(pools[pool], member); i >= 0 {
				*field(&pools[pool][i]) = v.set[name]
				continue
			}
		}
		return usagef("invalid --%s %s=%q: model %q has no replica %q (name the replicas with --replica, pool members POOL:NAME with --pool)",
			flag, name, v.set[name], model, name)
	}
	return nil
}

func indexOfReplica(rs []config.Replica, name string) int {
	for i, r := range rs {
		if r.Name == name {
			return i
		}
	}
	return -1
}

func newConnectValue() *perReplicaValue {
	return &perReplicaValue{what: "ENDPOINT", check: func(s string) error { return config.ValidateKVEndpoint(s, false) }}
}

func newPodValue() *perReplicaValue {
	return &perReplicaValue{what: "POD", check: config.ValidatePod}
}
