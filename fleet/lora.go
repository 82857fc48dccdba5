package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/internal/budget"
	dto "github.com/prometheus/client_model/go"
)

// LoRA adapters (see docs/lora.md).
//
// Resolution: a request's "model" names a configured model (its base
// model) or else a LoRA adapter of one. The gateway learns the adapters
// from each engine's GET /v1/models, where vLLM (and llm-d-inference-sim)
// list the adapters they serve with their base model as "parent": an
// adapter listed by an engine of a configured model is that model's, and
// is routed over the model's replicas whose engines list it. A model's
// optional allow-list (config.Model.Adapters) restricts it to the adapters
// named there; an allowed adapter that no engine lists is routed over all
// the model's replicas (engines that load adapters on demand). An adapter
// listed by engines of two models belongs to the model one of its own
// engines names as its parent, else to the first model by name; it is
// routed over all that model's replicas listing it. A name that is
// neither gets 404 naming it. The body is forwarded unchanged: the engine
// reads the adapter from its "model".
//
// State: every scrape reads vllm:lora_requests_info into each replica's
// gateway.AdapterReport, which the policies see (gateway.Candidate.LoRA).
// The prefix key is salted with the adapter (keys.Salt; on the
// exact index the key chains from the adapter's name, as the engines'
// events do), as vLLM's KV blocks are keyed by adapter.

// The engine metric and labels of adapter state (vLLM's names; the llm-d
// inference simulator uses the same).
const (
	metricLoRAInfo = "vllm:lora_requests_info"
	labelMaxLora   = "max_lora"
	labelRunning   = "running_lora_adapters"
	labelWaiting   = "waiting_lora_adapters"
)

// parseLoRAInfo reads an engine's adapter state from its
// vllm:lora_requests_info family, whose value is the Unix time its label
// combination was set and whose old combinations stay exposed: the series
// with the largest value is the current one. Values equal to the second,
// as the llm-d simulator sets them, are broken deterministically: the
// series whose label values, in label-name order (max_lora, running,
// waiting), compare smallest, which is the first of them on a page that
// Prometheus' Go client wrote (it sorts a family's series so), the one
// GIE's LoRASpec.getLatestMetric keeps (pkg/epp/framework/plugins/datalayer/
// extractor/metrics/loraspec.go at 1748e829: the first series with a
// strictly larger value). A series with empty lists is a valid state (no
// adapter in use), as GIE's newer extractor reads it. Lists are split at
// commas, names trimmed, empty names dropped; names longer than
// gateway.MaxAdapterName are dropped and lists cut at
// gateway.MaxReportedAdapters; a max_lora that is not a number in
// 0..gateway.MaxAdapterSlots reads as 0 (unknown). ok is false when the
// family is absent or has no series.
func parseLoRAInfo(f *dto.MetricFamily) (rep gateway.AdapterReport, ok bool) {
	var best *dto.Metric
	var bestV float64
	var bestL [3]string
	for _, m := range f.GetMetric() {
		v := sampleValue(m)
		l := loraLabels(m)
		if best == nil || v > bestV || (v == bestV && slices.Compare(l[:], bestL[:]) < 0) {
			best, bestV, bestL = m, v, l
		}
	}
	if best == nil {
		return rep, false
	}
	if n, err := strconv.Atoi(strings.TrimSpace(bestL[0])); err == nil && n >= 0 && n <= gateway.MaxAdapterSlots {
		rep.MaxLoras = n
	}
	rep.Running = splitAdapters(bestL[1])
	rep.Waiting = splitAdapters(bestL[2])
	return rep, true
}

// loraLabels returns a series' max_lora, running and waiting label values.
func loraLabels(m *dto.Metric) [3]string {
	var l [3]string
	for _, p := range m.GetLabel() {
		switch p.GetName() {
		case labelMaxLora:
			l[0] = p.GetValue()
		case labelRunning:
			l[1] = p.GetValue()
		case labelWaiting:
			l[2] = p.GetValue()
		}
	}
	return l
}

// splitAdapters splits a comma-separated adapter list (see parseLoRAInfo).
func splitAdapters(csv string) []string {
	var out []string
	for n := range strings.SplitSeq(csv, ",") {
		n = strings.TrimSpace(n)
		if n == "" || len(n) > gateway.MaxAdapterName {
			continue
		}
		if len(out) == gateway.MaxReportedAdapters {
			break
		}
		out = append(out, n)
	}
	return out
}

// maxModelsBytes bounds the GET /v1/models body read from an engine.
const maxModelsBytes = 4 << 20

// maxServedModels bounds the entries of an engine's model list.
const maxServedModels = 1 << 14

// errModelList reports an engine model list that could not be read.
var errModelList = errors.New("gateway: engine model list")

// parseModelList reads an OpenAI GET /v1/models body and returns the LoRA
// adapters it lists (entries whose "parent" is a non-empty string, as vLLM
// lists them), each mapped to its parent. The body must be one JSON object
// whose "data" is an array of at most maxServedModels entries; an entry
// that is not an object with a non-empty string "id" of at most
// gateway.MaxAdapterName bytes and a "parent" that is a string, null or
// absent is skipped: skipped counts them and bad describes the first
// (one broken entry does not cost the engine its other adapters). Other
// members are ignored.
func parseModelList(body []byte) (servedList, error) {
	var doc struct {
		Data []json.RawMessage `json:"data"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&doc); err != nil {
		return servedList{}, fmt.Errorf("%w: %v", errModelList, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return servedList{}, fmt.Errorf("%w: data after the JSON object", errModelList)
	}
	if doc.Data == nil {
		return servedList{}, fmt.Errorf("%w: no \"data\" array", errModelList)
	}
	if len(doc.Data) > maxServedModels {
		return servedList{}, fmt.Errorf("%w: %d models, at most %d", errModelList, len(doc.Data), maxServedModels)
	}
	out := servedList{parents: map[string]string{}}
	for i, raw := range doc.Data {
		id, parent, err := parseModelEntry(raw)
		if err != nil {
			if out.skipped == 0 {
				out.bad = fmt.Errorf("%w: data[%d]: %v", errModelList, i, err)
			}
			out.skipped++
			continue
		}
		if parent != "" {
			out.parents[id] = parent
		}
	}
	return out, nil
}

// servedList is what parseModelList read: the adapters, each mapped to its
// parent, and the entries it skipped (bad describes the first).
type servedList struct {
	parents map[string]string
	skipped int
	bad     error
}

// parseModelEntry reads one entry of a model list: its id and its parent
// ("" when null or absent).
func parseModelEntry(raw json.RawMessage) (id, parent string, err error) {
	// Parent is decoded as a *string, not kept raw: an entry that names
	// "parent" twice, a number then a string, is refused as encoding/json
	// refuses it, rather than read by its last value.
	var e struct {
		ID     *string `json:"id"`
		Parent *string `json:"parent"`
	}
	err = json.Unmarshal(raw, &e)
	var te *json.UnmarshalTypeError
	badParent := errors.As(err, &te) && te.Field == "parent"
	if err != nil && !badParent {
		return "", "", fmt.Errorf("not an object with a string id: %v", err)
	}
	if e.ID == nil || *e.ID == "" || len(*e.ID) > gateway.MaxAdapterName {
		return "", "", fmt.Errorf("id must be a string of 1..%d bytes", gateway.MaxAdapterName)
	}
	if badParent {
		return "", "", fmt.Errorf("id %q: parent must be a string or null", *e.ID)
	}
	if e.Parent == nil {
		return *e.ID, "", nil
	}
	return *e.ID, *e.Parent, nil
}

// fetchModelList fetches an engine's GET /v1/models body, at most
// maxModelsBytes, charged to h as it is read (the caller releases h once
// it has parsed the body).
func fetchModelList(ctx context.Context, client *http.Client, base string, h *budget.Hold) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errModelList, base, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errModelList, base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("%w: %s: status %d", errModelList, base, resp.StatusCode)
	}
	body, err := h.ReadAll(resp.Body, maxModelsBytes, 1)
	if errors.Is(err, budget.ErrTooLong) {
		return nil, fmt.Errorf("%w: %s: body over %d bytes", errModelList, base, maxModelsBytes)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errModelList, base, err)
	}
	return body, nil
}

// fetchServed fetches an engine's GET /v1/models and returns its adapters,
// with the entries skipped (see parseModelList); the body is charged to b
// while it is read and parsed.
func fetchServed(ctx context.Context, client *http.Client, base string, b *budget.Budget) (servedList, error) {
	h := budget.Hold{B: b}
	defer h.Release()
	body, err := fetchModelList(ctx, client, base, &h)
	if err != nil {
		return servedList{}, err
	}
	served, err := parseModelList(body)
	if err != nil {
		return servedList{}, fmt.Errorf("%s: %w", base, err)
	}
	return served, nil
}

// endpointLoRA is an engine's adapter state: its last adapter report and
// the adapters its last discovery found.
type endpointLoRA struct {
	report  atomic.Pointer[gateway.AdapterReport]
	served  atomic.Pointer[servedAdapters]
	skipped atomic.Uint64 // model list entries skipped, over all discoveries
}

// servedAdapters is the outcome of an engine's discoveries.
type servedAdapters struct {
	// parents maps each adapter the engine lists to its parent: the last
	// successful discovery's, kept through failures.
	parents map[string]string
	// err is the last discovery's error, "" when it succeeded.
	err string
}

// maxDiscoveredEntries bounds the entries kept of all the engines' model
// lists together, for each of the two tables that keep them (the
// adapters, servedAdapters; the base models, modelInfoTable): an engine's
// new list that would take a table past it is refused, and the engine's
// last list kept.
var maxDiscoveredEntries = 1 << 17 // a variable for tests

// DiscoverAll fetches every engine's GET /v1/models once and, when the
// adapters an engine lists changed, rebuilds the table that resolves
// adapter names. Run calls it every DiscoverInterval; a failed fetch keeps
// the engine's last list, and so does a list that would take the
// adapters of all engines past maxDiscoveredEntries.
func (s *Fleet) DiscoverAll(ctx context.Context) {
	var changed atomic.Bool
	st := s.state.Load()
	s.eachEndpoint(ctx, func(ctx context.Context, ep *Endpoint) {
		got, err := fetchServed(ctx, s.control, ep.Base, s.listBudget)
		if got.skipped > 0 {
			ep.lora.skipped.Add(uint64(got.skipped))
			s.log.Debug("gateway: adapter discovery skipped bad entries of the engine's model list", "address", ep.Base, "skipped", got.skipped, "first", got.bad)
		}
		s.adapterRoom.Lock() // the check of the bound and the store, together
		defer s.adapterRoom.Unlock()
		old := ep.lora.served.Load()
		next := &servedAdapters{parents: got.parents}
		if err == nil {
			total := len(got.parents)
			for _, e := range st.Endpoints {
				if a := e.lora.served.Load(); e != ep && a != nil {
					total += len(a.parents)
				}
			}
			if total > maxDiscoveredEntries {
				err = fmt.Errorf("%w: %s: its %d adapters would take all engines' to %d, past %d", errModelList, ep.Base, len(got.parents), total, maxDiscoveredEntries)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Debug("gateway: adapter discovery failed; keeping the engine's last list", "address", ep.Base, "err", err)
			next = &servedAdapters{err: err.Error()}
			if old != nil {
				next.parents = old.parents
			}
		}
		ep.lora.served.Store(next)
		if old == nil || !maps.Equal(old.parents, next.parents) {
			changed.Store(true)
		}
	})
	if changed.Load() {
		s.mu.Lock()
		defer s.mu.Unlock()
		cur := s.state.Load()
		next := *cur
		next.Adapters = buildAdapterTable(&next)
		s.state.Store(&next)
	}
}

// AdapterRoute is where requests for one adapter go.
type AdapterRoute struct {
	Name  string
	Model *Model
	// Eligible is the model's replicas whose engines list the adapter;
	// nil means all of them (allowed but listed by none).
	Eligible map[string]bool
	// parentMatch: the engines name the model as the adapter's parent.
	parentMatch bool
	// refused: the model's engines list it, but its allow-list does not.
	refused bool
}

// adapterTable resolves adapter names; immutable once built.
type adapterTable struct {
	byName map[string]*AdapterRoute
}

// buildAdapterTable resolves the adapters of st's models from their
// engines' discoveries and allow-lists (see the top of this file).
func buildAdapterTable(st *State) *adapterTable {
	t := &adapterTable{byName: map[string]*AdapterRoute{}}
	for _, name := range slices.Sorted(maps.Keys(st.Models)) {
		ms := st.Models[name]
		allow := map[string]bool{}
		for _, a := range ms.Cfg.Adapters {
			allow[a] = true
		}
		// The model's replicas listing each adapter, and whether one of
		// them names the model as its parent: the model's claim, decided
		// once over all its replicas.
		listed, named := map[string]map[string]bool{}, map[string]bool{}
		for _, rname := range ms.Order {
			sv := ms.ByName[rname].lora.served.Load()
			if sv == nil {
				continue
			}
			for a, parent := range sv.parents {
				if _, isModel := st.Models[a]; isModel {
					continue
				}
				if listed[a] == nil {
					listed[a] = map[string]bool{}
				}
				listed[a][rname] = true
				named[a] = named[a] || parent == ms.Name
			}
		}
		for _, a := range slices.Sorted(maps.Keys(listed)) {
			r := t.byName[a]
			switch {
			case len(allow) > 0 && !allow[a]:
				if r == nil {
					t.byName[a] = &AdapterRoute{Name: a, Model: ms, refused: true}
				}
			case r == nil || r.refused || (named[a] && !r.parentMatch):
				t.byName[a] = &AdapterRoute{Name: a, Model: ms, Eligible: listed[a], parentMatch: named[a]}
			}
		}
	}
	// An allowed adapter that no engine lists (or only engines whose
	// model refuses it) is the first allowing model's, over all its
	// replicas: after every model's engines, so that one listing it wins
	// whichever sorts first.
	for _, name := range slices.Sorted(maps.Keys(st.Models)) {
		ms := st.Models[name]
		for _, a := range ms.Cfg.Adapters {
			if _, isModel := st.Models[a]; isModel {
				continue
			}
			if r := t.byName[a]; r == nil || r.refused {
				t.byName[a] = &AdapterRoute{Name: a, Model: ms}
			}
		}
	}
	return t
}

// AdapterRoute returns the route of the adapter name, or an error wrapping
// ErrModelNotFound (answered with 404) when name is neither a configured
// model nor an adapter of one, or an adapter the allow-list refuses.
func (st *State) AdapterRoute(name string) (*AdapterRoute, error) {
	var r *AdapterRoute
	if st.Adapters != nil {
		r = st.Adapters.byName[name]
	}
	switch {
	case r == nil:
		return nil, fmt.Errorf("%w: %q is not served by this gateway: it is neither a configured model nor a LoRA adapter of one (GET /v1/models lists them)", ErrModelNotFound, name)
	case r.refused:
		return nil, fmt.Errorf("%w: LoRA adapter %q of model %q is not in the model's adapter allow-list (models.%s.adapters)", ErrModelNotFound, name, r.Model.Name, r.Model.Name)
	}
	return r, nil
}

// EngineAdapters is an engine's LoRA adapter state in GET /stats.
type EngineAdapters struct {
	// Served lists the adapters its GET /v1/models lists, sorted.
	Served []string `json:"served"`
	// DiscoveryError is the last discovery's error, "" when it succeeded.
	DiscoveryError string `json:"discovery_error,omitempty"`
	// SkippedEntries counts the entries of its model lists that were
	// skipped as malformed, over all discoveries.
	SkippedEntries uint64 `json:"skipped_entries,omitempty"`
	// Running, Waiting and MaxLoras are its last vllm:lora_requests_info
	// (absent before the first).
	Running  []string `json:"running,omitempty"`
	Waiting  []string `json:"waiting,omitempty"`
	MaxLoras int      `json:"max_loras,omitempty"`
}

// adapterStats returns ep's adapter state for GET /stats, nil when it has
// none to show.
func adapterStats(ep *Endpoint) *EngineAdapters {
	sv, rep := ep.lora.served.Load(), ep.lora.report.Load()
	if sv == nil && rep == nil {
		return nil
	}
	out := &EngineAdapters{Served: []string{}}
	if sv != nil {
		out.Served = slices.Sorted(maps.Keys(sv.parents))
		out.DiscoveryError = sv.err
	}
	out.SkippedEntries = ep.lora.skipped.Load()
	if rep != nil {
		out.Running = slices.Sorted(slices.Values(rep.Running))
		out.Waiting = slices.Sorted(slices.Values(rep.Waiting))
		out.MaxLoras = rep.MaxLoras
	}
	return out
}

// adapterEntries returns the adapters GET /v1/models lists beside the
// configured models, sorted: each with its model as parent.
func adapterEntries(st *State) []ModelEntry {
	if st.Adapters == nil {
		return nil
	}
	var out []ModelEntry
	for _, name := range slices.Sorted(maps.Keys(st.Adapters.byName)) {
		r := st.Adapters.byName[name]
		if r.refused {
			continue
		}
		out = append(out, ModelEntry{ID: name, Object: "model", OwnedBy: "exa", Parent: r.Model.Name})
	}
	return out
}
