package fleet

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/httpclient"
	"github.com/prometheus/client_golang/prometheus"
)

// Apply installs a routing configuration. Requests already being served
// finish on the routing table they started with; new requests use the new
// one at once, so no request is dropped. A model whose mode, SLO and load
// weights are unchanged keeps its gateway (and so its cache index and
// counters), with replicas added and removed as the configuration says;
// a model whose routing options changed gets a fresh gateway. Engines are
// shared by address across models and keep their health state.
//
// A model with disaggregate set whose prefill and decode pools are both
// defined is served by them (replicas named pool/replica), prefill and
// decode split as docs/disaggregation.md describes: the prefill pool gets
// a cache-aware gateway, the decode pool a load-aware one (the model's
// mode does not apply; its SLO and load weights do). Until both pools are
// defined it is proxied over its replicas; with none it is accepted (the
// CLI sets the pool names before the pools exist) and answers 503 naming
// the missing pools.
//
// Apply works in two phases: it first builds and checks every model's
// new table without touching the running ones, and only then updates the
// kept gateways and publishes the new tables. An invalid configuration is
// an error and changes nothing.
func (s *Fleet) Apply(f *config.File) error {
	if f == nil {
		f = &config.File{Version: config.Version}
	}
	f = f.Clone()
	if f.Version == 0 {
		f.Version = config.Version
	}
	if err := f.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyLocked(f)
}

// reapply applies the running configuration again, so that the tables
// take up what the engines reported since (an engine's KV-cache size:
// tableOf). Replicas whose capacity changed are replaced in place
// (syncReplicas), the others kept with their index.
func (s *Fleet) reapply() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyLocked(s.state.Load().File.Clone())
}

// applyLocked is Apply's work on a validated configuration, with s.mu
// held.
func (s *Fleet) applyLocked(f *config.File) error {
	old := s.state.Load()
	next := &State{File: f, Models: make(map[string]*Model, len(f.Models)), Endpoints: map[string]*Endpoint{}}
	// Phase 1: build every table; nothing running is changed.
	plans := make([]modelPlan, 0, len(f.Models))
	for _, name := range f.Names() {
		p, err := s.planModel(name, f.Models[name], old, next)
		if err != nil {
			return err
		}
		plans = append(plans, p)
		next.Models[name] = p.ms
	}
	// Listen where the exact index's events come to: a port taken fails
	// the configuration, before anything running is changed.
	bound, err := s.kv.bindNew(buildKVTable(next.Models), next.Models)
	if err != nil {
		return err
	}
	// Phase 2: update the kept gateways. Every limit the gateway enforces
	// was checked in phase 1, so this does not fail; if it did, the model
	// gets a fresh gateway rather than a half-updated one.
	for _, p := range plans {
		if p.keep == nil {
			continue
		}
		p.ms.Gateway = s.syncKept(p.ms.Name, p.keep, p.want, p.opts)
		if p.ms.PD != nil {
			p.ms.PD.Plan.Decode = p.ms.Gateway
		}
	}
	for _, p := range plans {
		if p.pkeep != nil {
			p.ms.PD.Plan.Prefill = s.syncKept(p.ms.Name, p.pkeep, p.pwant, p.popts)
		}
	}
	next.KV = buildKVTable(next.Models)
	next.Adapters = buildAdapterTable(next)
	s.state.Store(next)
	s.kv.sync(next.KV)
	s.kv.reconcile(old.KV, next.KV)
	if len(bound) > 0 {
		s.log.Info("gateway: listening for KV events", "endpoints", bound)
	}
	s.closeDropped(old, next)
	s.dropStaleSeries(old, next)
	for _, f := range s.onApply {
		f(old, next)
	}
	if ctx := s.running.Load(); ctx != nil && (*ctx).Err() == nil {
		for addr, ep := range next.Endpoints {
			if _, had := old.Endpoints[addr]; !had {
				go s.learnCapacity(*ctx, ep)
			}
		}
	}
	return nil
}

// OnApply adds f to the functions called after each configuration is
// published, with the state it replaced: the fronts drop their series of
// the replicas the new one lacks (front.Metrics.DropReplicas). f runs
// under the lock that serialises Apply, so it must be quick and must not
// call Apply or Reload. Safe for concurrent use.
func (s *Fleet) OnApply(f func(old, next *State)) {
	s.mu.Lock()
	s.onApply = append(s.onApply, f)
	s.mu.Unlock()
}

// dropStaleSeries deletes the series of engines that old had and next
// does not (their health gauge and their counters by address), so that
// /metrics stops reporting them and engines that come and go (pods, each
// with a new address) do not grow the series without bound. (The
// per-model series are counters, kept across reloads.)
func (s *Fleet) dropStaleSeries(old, next *State) {
	m := s.metrics
	for addr := range old.Endpoints {
		if _, ok := next.Endpoints[addr]; !ok {
			m.healthy.DeleteLabelValues(addr)
			m.readmissions.DeleteLabelValues(addr)
			m.probeFails.DeleteLabelValues(addr)
			m.scrapeErrors.DeleteLabelValues(addr)
			m.ejections.DeletePartialMatch(prometheus.Labels{"address": addr})
		}
	}
}

// closeDropped closes the idle pooled connections to engines that old used
// and next does not (unless another engine of next shares the host).
// Requests still in flight to them keep their connections, which prune
// closes once they fall idle.
func (s *Fleet) closeDropped(old, next *State) {
	if s.pool == nil {
		return
	}
	live := make(map[string]bool, len(next.Endpoints))
	for addr := range next.Endpoints {
		live[httpclient.HostKey(addr)] = true
	}
	for addr := range old.Endpoints {
		if _, ok := next.Endpoints[addr]; ok {
			continue
		}
		if host := httpclient.HostKey(addr); host != "" && !live[host] {
			s.pool.CloseIdle(host)
		}
	}
}

// syncKept syncs a kept gateway to want and returns it, or when that
// fails (it should not: phase 1 checked every limit) a fresh gateway.
func (s *Fleet) syncKept(model string, keep *gateway.Gateway, want []gateway.Replica, opts []gateway.Option) *gateway.Gateway {
	err := syncReplicas(keep, want)
	if err == nil {
		return keep
	}
	s.log.Error("gateway: updating a kept gateway failed; starting it afresh", "model", model, "err", err)
	gw, nerr := s.newGateway(want, opts...)
	if nerr != nil {
		// Keep the updated gateway: the proxy resolves each decision's
		// engine by address, so it still serves.
		s.log.Error("gateway: rebuilding the gateway failed", "model", model, "err", nerr)
		return keep
	}
	return gw
}

// modelPlan is one model's part of an Apply: its new table and, when its
// gateway is kept, the replicas that gateway must be synced to.
type modelPlan struct {
	ms   *Model
	keep *gateway.Gateway // the running gateway to sync; nil when ms.gw is new
	want []gateway.Replica
	opts []gateway.Option
	// pkeep, pwant and popts are the same for the prefill pool's gateway
	// of a disaggregated model (ms.pd.dis.Prefill).
	pkeep *gateway.Gateway
	pwant []gateway.Replica
	popts []gateway.Option
}

// servedByPools reports whether a model is disaggregated and served by
// its prefill and decode pools: both are defined.
func servedByPools(cfg config.Model) bool {
	if !cfg.Disaggregate {
		return false
	}
	_, p := cfg.Pools[cfg.PrefillPool]
	_, d := cfg.Pools[cfg.DecodePool]
	return p && d
}

// missingPools returns the prefill and decode pools a disaggregated model
// without replicas of its own names but does not define.
func missingPools(cfg config.Model) []string {
	if !cfg.Disaggregate || len(cfg.Replicas) > 0 || servedByPools(cfg) {
		return nil
	}
	var out []string
	for _, pool := range []string{cfg.PrefillPool, cfg.DecodePool} {
		if _, ok := cfg.Pools[pool]; !ok {
			out = append(out, pool)
		}
	}
	return out
}

// sameRouting reports whether two model configurations route alike, so a
// gateway built for a can serve b once its replicas are synced.
func sameRouting(a, b config.Model) bool {
	if a.Mode != b.Mode || a.SLOLatencyMS != b.SLOLatencyMS {
		return false
	}
	if a.IndexName() != b.IndexName() || (a.Exact() && a.TokenBlockSize() != b.TokenBlockSize()) {
		return false // the index's keys change
	}
	if (a.LoadWeights == nil) != (b.LoadWeights == nil) {
		return false
	}
	return a.LoadWeights == nil || *a.LoadWeights == *b.LoadWeights
}

func (s *Fleet) endpointFor(addr string, old, next *State) *Endpoint {
	if ep, ok := next.Endpoints[addr]; ok {
		return ep
	}
	ep, ok := old.Endpoints[addr]
	if !ok {
		ep = NewEndpoint(addr)
		ep.Health.ejectAfter = s.opts.EjectAfter
		ep.Health.readmitAfter = s.opts.ReadmitAfter
		ep.Health.clock, ep.Health.backoff, ep.Health.maxBackoff = s.opts.Clock, s.opts.EjectionTime, 10*s.opts.EjectionTime
	}
	next.Endpoints[addr] = ep
	return ep
}

// attach gives a model's state what the front keeps with it
// (Options.Attach) and, on the exact index, its block size and counters.
func (s *Fleet) attach(ms *Model) {
	if s.opts.Attach != nil {
		ms.Front = s.opts.Attach(ms)
	}
	if ms.Cfg.Exact() {
		ms.ExactBlockSize, ms.ExactCounters = ms.Cfg.TokenBlockSize(), s.kv.countersOf(ms.Name)
	}
}

// planModel builds a model's new table without changing any running
// gateway: a fresh gateway when the routing options changed, otherwise the
// list of replicas the running gateway is to be synced to, checked against
// every limit AddReplica enforces.
func (s *Fleet) planModel(name string, cfg config.Model, old, next *State) (modelPlan, error) {
	if servedByPools(cfg) {
		return s.planPD(name, cfg, old, next)
	}
	ms := &Model{Name: name, Cfg: cfg, ByName: make(map[string]*Endpoint, len(cfg.Replicas)), Disaggregate: cfg.Disaggregate,
		MissingPools: missingPools(cfg), Mode: cfg.Mode}
	want, err := s.tableOf(ms, cfg.Replicas, "", old, next)
	if err != nil {
		return modelPlan{}, err
	}
	s.attach(ms)
	if len(want) == 0 {
		ms.NoReplicas = true
		if len(ms.MissingPools) > 0 {
			s.log.Warn("gateway: disaggregated model names pools that are not defined; it answers 503 until they are",
				"model", name, "pools", ms.MissingPools)
		}
		return modelPlan{ms: ms}, nil
	}
	opts, err := cfg.Options()
	if err != nil {
		return modelPlan{}, err
	}
	// The fleet's clock, which stamps each scraped load (Load.At), is the
	// gateway's too, unless GatewayOptions names another.
	opts = append(append(opts, gateway.WithClock(s.opts.Clock)), s.opts.GatewayOptions...)
	if prev, ok := old.Models[name]; ok && prev.Gateway != nil && prev.PD == nil && sameRouting(prev.Cfg, cfg) {
		ms.Gateway = prev.Gateway
		return modelPlan{ms: ms, keep: prev.Gateway, want: want, opts: opts}, nil
	}
	gw, err := s.newGateway(want, opts...)
	if err != nil {
		return modelPlan{}, fmt.Errorf("%w (model %q)", err, name)
	}
	ms.Gateway = gw
	return modelPlan{ms: ms, want: want, opts: opts}, nil
}

// tableOf adds replicas to a model's table (its endpoints, names and
// order), each named pool/name when pool is not "", and returns them as
// gateway replicas with their engines' health.
func (s *Fleet) tableOf(ms *Model, reps []config.Replica, pool string, old, next *State) ([]gateway.Replica, error) {
	field := "models." + ms.Name + ".replicas"
	if pool != "" {
		field = "models." + ms.Name + ".pools." + pool
	}
	if len(reps) > gateway.MaxReplicas {
		return nil, &config.FieldError{Field: field, Value: fmt.Sprint(len(reps)),
			Reason: fmt.Sprintf("at most %d replicas per model", gateway.MaxReplicas)}
	}
	want := make([]gateway.Replica, 0, len(reps))
	for _, r := range reps {
		if pool != "" {
			r.Name = pool + "/" + r.Name
		}
		if _, dup := ms.ByName[r.Name]; r.Name == "" || dup || r.CacheBlocks < 0 || r.CacheBlocks > gateway.MaxCacheBlocks {
			// config.Validate rejects these; checked again because phase 2 must not fail.
			return nil, &config.FieldError{Field: field, Value: r.Name,
				Reason: "empty or duplicate name, or cache_blocks out of range"}
		}
		ep := s.endpointFor(NormalizeAddress(r.Address), old, next)
		ms.ByName[r.Name] = ep
		ms.Order = append(ms.Order, r.Name)
		g := r.Gateway()
		g.Name = r.Name
		g.Address = ep.Base
		if g.CacheBlocks == 0 {
			// Unset: the engine's own KV-cache size, once a scrape has
			// reported it (else the gateway's default).
			g.CacheBlocks = cacheBlocksFor(ep.kvTokens.Load(), ms.Cfg.Exact(), ms.Cfg.TokenBlockSize(), s.opts.BlockSize)
		}
		g.Unhealthy = !ep.Health.Healthy()
		want = append(want, g)
	}
	return want, nil
}

// syncReplicas makes gw's replica table match want: replicas gone or
// changed (address, capacity) are removed, new ones added, and every
// replica's health set. New replicas are added before the gone ones are
// removed, so the table never goes empty, unless that would pass
// gateway.MaxReplicas.
func syncReplicas(gw *gateway.Gateway, want []gateway.Replica) error {
	have := map[string]gateway.ReplicaStatus{}
	for _, r := range gw.Replicas() {
		have[r.Name] = r
	}
	wanted := map[string]gateway.Replica{}
	for _, r := range want {
		wanted[r.Name] = r
	}
	var added []gateway.Replica
	for _, r := range want {
		h, ok := have[r.Name]
		capacity := r.CacheBlocks
		if capacity == 0 {
			capacity = unsetCacheBlocks // as AddReplica gives it
		}
		if ok && h.Address == r.Address && h.CacheBlocks == capacity {
			continue
		}
		if ok {
			// Changed: replace it in place, which keeps the count.
			if err := gw.RemoveReplica(r.Name); err != nil {
				return err
			}
			if err := gw.AddReplica(r); err != nil {
				return err
			}
			continue
		}
		added = append(added, r)
	}
	n := len(have)
	for len(added) > 0 && n < gateway.MaxReplicas {
		if err := gw.AddReplica(added[0]); err != nil {
			return err
		}
		added, n = added[1:], n+1
	}
	for name := range have {
		if _, ok := wanted[name]; !ok {
			if err := gw.RemoveReplica(name); err != nil {
				return err
			}
		}
	}
	for _, r := range added {
		if err := gw.AddReplica(r); err != nil {
			return err
		}
	}
	for _, r := range want {
		if err := gw.SetHealthy(r.Name, !r.Unhealthy); err != nil {
			return err
		}
	}
	return nil
}

// unsetCacheBlocks is the capacity a gateway gives a replica whose
// CacheBlocks is 0 (the gateway's default), so that syncReplicas replaces
// a kept replica whose configured capacity was unset.
var unsetCacheBlocks = func() int {
	gw, err := gateway.New([]gateway.Replica{{Name: "r"}})
	if err != nil {
		panic(err)
	}
	return gw.Replicas()[0].CacheBlocks
}()

// NormalizeAddress turns a configured replica address into a base URL:
// "host:port" gets an http:// scheme and a trailing slash is dropped.
func NormalizeAddress(addr string) string {
	addr = strings.TrimRight(strings.TrimSpace(addr), "/")
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return addr
}

// Reload loads the configuration file (Options.ConfigPath) if it changed
// since the last load (a new file, as an atomic rename makes, or a new size or modification time, or
// new contents when the last load was within racyWindow of the file's
// modification time, as a rewrite in the same tick of the file system's
// clock leaves both as they were) and applies it. It reports whether it applied a new configuration. A corrupt or
// invalid file is an error and the running configuration stays; so does a
// file that disappears after it was loaded. Run calls Reload every
// ReloadInterval; tests and embedders may call it directly.
func (s *Fleet) Reload() (bool, error) {
	path := s.opts.ConfigPath
	if path == "" {
		return false, nil
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		s.mu.Lock()
		seen, missing := s.fileSeen, s.fileMissing
		s.fileMissing = true
		s.mu.Unlock()
		if seen || missing {
			return false, nil // keep serving the last good configuration
		}
		return false, s.applyCounted(&config.File{Version: config.Version})
	case err != nil:
		s.metrics.reloads.WithLabelValues("error").Inc()
		return false, fmt.Errorf("gateway: config %s: %w", path, err)
	}
	s.mu.Lock()
	same := s.fileSeen && s.fileInfo != nil && os.SameFile(s.fileInfo, fi) && fi.ModTime().Equal(s.fileMod) && fi.Size() == s.fileSize
	racy := s.fileRacy
	s.mu.Unlock()
	if same && !racy {
		return false, nil
	}
	data, err := s.readConfig(path)
	if errors.Is(err, fs.ErrNotExist) {
		// Gone since the Stat (removed, or by a writer that removes it
		// before writing it again): a missing file, not the empty
		// configuration; the next Reload looks again.
		return false, nil
	}
	var digest [32]byte // none for a failed read
	if err == nil {
		digest = sha256.Sum256(data)
	}
	s.mu.Lock()
	first := !s.fileSeen
	if same && err == nil && digest == s.fileDigest {
		// Read again only because the last read was racy: as it was.
		s.fileRacy = time.Since(fi.ModTime()) < racyWindow
		s.mu.Unlock()
		return false, nil
	}
	s.fileSeen, s.fileInfo, s.fileMod, s.fileSize = true, fi, fi.ModTime(), fi.Size()
	s.fileDigest, s.fileRacy = digest, time.Since(fi.ModTime()) < racyWindow
	s.mu.Unlock()
	var f *config.File
	if err != nil {
		err = fmt.Errorf("gateway: read config: %w", err)
	} else {
		f, err = config.Decode(path, data)
	}
	failed := "gateway: config reload failed; keeping the running configuration"
	if first {
		failed = "gateway: config load failed"
	}
	if err != nil {
		s.metrics.reloads.WithLabelValues("error").Inc()
		s.log.Error(failed, "file", path, "err", err)
		s.reportReload(path, fi, err)
		return false, err
	}
	if err := s.applyCounted(f); err != nil {
		s.log.Error(failed, "file", path, "err", err)
		s.reportReload(path, fi, err)
		return false, err
	}
	s.log.Info("gateway: configuration loaded", "file", path, "models", len(f.Models))
	s.reportReload(path, fi, nil)
	return true, nil
}

func (s *Fleet) applyCounted(f *config.File) error {
	if err := s.Apply(f); err != nil {
		s.metrics.reloads.WithLabelValues("error").Inc()
		return err
	}
	s.metrics.reloads.WithLabelValues("ok").Inc()
	return nil
}
