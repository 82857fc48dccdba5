package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"

	"github.com/examlops/gateway/internal/budget"
)

// engineModel is what an engine's GET /v1/models says of one model it
// serves (vLLM's ModelCard): its root (the weights' path or name) and
// max_model_len (0 when not given).
type engineModel struct {
	root        string
	maxModelLen int
}

// modelInfoTable holds, per engine address, the base models (entries
// without a parent) its last GET /v1/models listed, by id. Safe for
// concurrent use; the zero value is empty. It holds only configured
// addresses (pruned at each discovery), each with at most
// maxServedModels entries.
type modelInfoTable struct {
	mu sync.Mutex
	m  map[string]map[string]engineModel
}

// maxModelLenLimit bounds a max_model_len read from an engine (2^31-1);
// larger values are dropped as not meaningful.
const maxModelLenLimit = 1<<31 - 1

// parseModelInfo reads an OpenAI GET /v1/models body (see parseModelList
// for its shape and bounds) and returns its base models, those whose
// "parent" is absent or null, by id, with their "root" (a string, else
// "") and "max_model_len" (a whole number in 1..maxModelLenLimit, else
// 0).
func parseModelInfo(body []byte) (map[string]engineModel, error) {
	var doc struct {
		Data []struct {
			ID          *string         `json:"id"`
			Parent      json.RawMessage `json:"parent"`
			Root        json.RawMessage `json:"root"`
			MaxModelLen json.RawMessage `json:"max_model_len"`
		} `json:"data"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %v", errModelList, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the JSON object", errModelList)
	}
	if len(doc.Data) > maxServedModels {
		return nil, fmt.Errorf("%w: %d models, at most %d", errModelList, len(doc.Data), maxServedModels)
	}
	out := map[string]engineModel{}
	for _, e := range doc.Data {
		if e.ID == nil || *e.ID == "" {
			continue
		}
		if p := bytes.TrimSpace(e.Parent); len(p) > 0 && string(p) != "null" {
			continue
		}
		var m engineModel
		_ = json.Unmarshal(e.Root, &m.root)
		var n float64
		if json.Unmarshal(e.MaxModelLen, &n) == nil && n >= 1 && n <= maxModelLenLimit && n == float64(int(n)) {
			m.maxModelLen = int(n)
		}
		out[*e.ID] = m
	}
	return out, nil
}

// DiscoverModelInfo fetches every engine's GET /v1/models once for the
// root and max_model_len of the models it serves, which the gateway's own
// /v1/models then shows. A failed fetch keeps the engine's last answer,
// and so does a list that would take the base models of all engines past
// maxDiscoveredEntries.
// Run calls it every DiscoverInterval.
func (s *Fleet) DiscoverModelInfo(ctx context.Context) {
	st := s.state.Load()
	s.eachEndpoint(ctx, func(ctx context.Context, ep *Endpoint) {
		got, err := fetchModelInfo(ctx, s.control, ep.Base, s.listBudget)
		if err != nil {
			return
		}
		t := &s.modelInfo
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.m == nil {
			t.m = map[string]map[string]engineModel{}
		}
		total := len(got)
		for a, m := range t.m {
			if a != ep.Base {
				total += len(m)
			}
		}
		if total > maxDiscoveredEntries {
			s.log.Debug("gateway: an engine's model list would take all engines' past their bound; keeping its last", "address", ep.Base, "models", len(got), "bound", maxDiscoveredEntries)
			return
		}
		t.m[ep.Base] = got
	})
	t := &s.modelInfo
	t.mu.Lock()
	defer t.mu.Unlock()
	for a := range t.m {
		if st.Endpoints[a] == nil && s.state.Load().Endpoints[a] == nil {
			delete(t.m, a)
		}
	}
}

// fetchModelInfo fetches an engine's GET /v1/models and returns its base
// models (parseModelInfo); the body is charged to b while it is read and
// parsed.
func fetchModelInfo(ctx context.Context, client *http.Client, base string, b *budget.Budget) (map[string]engineModel, error) {
	h := budget.Hold{B: b}
	defer h.Release()
	body, err := fetchModelList(ctx, client, base, &h)
	if err != nil {
		return nil, err
	}
	return parseModelInfo(body)
}

// modelCard returns the /v1/models entry of the configured model ms: its
// root is the one its engines report for it (by the model's name, or the
// one base model an engine lists), else the name; max_model_len the
// smallest its engines report (what every replica accepts), absent when
// none does.
func (s *Fleet) modelCard(ms *Model, name string) ModelEntry {
	e := ModelEntry{ID: name, Object: "model", OwnedBy: "exa", Root: name}
	if ms == nil {
		return e
	}
	t := &s.modelInfo
	t.mu.Lock()
	defer t.mu.Unlock()
	var roots []string
	for _, rep := range ms.Order {
		ep := ms.ByName[rep]
		if ep == nil {
			continue
		}
		models := t.m[ep.Base]
		m, ok := models[name]
		if !ok && len(models) == 1 {
			for _, only := range models {
				m, ok = only, true
			}
		}
		if !ok {
			continue
		}
		if m.root != "" {
			roots = append(roots, m.root)
		}
		if m.maxModelLen > 0 && (e.MaxModelLen == nil || m.maxModelLen < *e.MaxModelLen) {
			n := m.maxModelLen
			e.MaxModelLen = &n
		}
	}
	if len(roots) > 0 {
		slices.Sort(roots)
		e.Root = roots[0]
	}
	return e
}
