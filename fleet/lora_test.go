package fleet

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func loraPage(series ...string) string {
	return "# TYPE vllm:lora_requests_info gauge\n" + strings.Join(series, "\n") + "\n"
}

func TestParseLoRAInfo(t *testing.T) {
	real, err := os.ReadFile("testdata/metrics/llm-d-inference-sim-v0.10.2-lora-busy.txt")
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		page string
		want *gateway.AdapterReport
	}{
		{"llm-d-inference-sim v0.10.2, two adapters, busy: the newest series", string(real),
			&gateway.AdapterReport{Running: []string{"b"}, Waiting: []string{"a"}, MaxLoras: 1}},
		{"no family", "vllm:num_requests_waiting 1\n", nil},
		{"idle is a state", loraPage(
			`vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 100`,
			`vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 101`),
			&gateway.AdapterReport{MaxLoras: 2}},
		// Equal values: the smallest label values in name order, whatever
		// the order on the page (GIE keeps the first on a sorted page).
		{"tie", loraPage(
			`vllm:lora_requests_info{max_lora="2",running_lora_adapters="b",waiting_lora_adapters=""} 7`,
			`vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters="c"} 7`,
			`vllm:lora_requests_info{max_lora="2",running_lora_adapters="x",waiting_lora_adapters=""} 6`),
			&gateway.AdapterReport{Running: []string{"a"}, Waiting: []string{"c"}, MaxLoras: 2}},
		{"tie, other order", loraPage(
			`vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters="c"} 7`,
			`vllm:lora_requests_info{max_lora="2",running_lora_adapters="b",waiting_lora_adapters=""} 7`),
			&gateway.AdapterReport{Running: []string{"a"}, Waiting: []string{"c"}, MaxLoras: 2}},
		{"lists", loraPage(`vllm:lora_requests_info{max_lora=" 3 ",running_lora_adapters=" a, b ,,a",waiting_lora_adapters="c,"} 1`),
			&gateway.AdapterReport{Running: []string{"a", "b", "a"}, Waiting: []string{"c"}, MaxLoras: 3}},
		{"bad max_lora reads as unknown", loraPage(`vllm:lora_requests_info{max_lora="many",running_lora_adapters="a"} 1`),
			&gateway.AdapterReport{Running: []string{"a"}}},
		{"negative max_lora", loraPage(`vllm:lora_requests_info{max_lora="-1"} 1`), &gateway.AdapterReport{}},
		{"long name dropped", loraPage(`vllm:lora_requests_info{running_lora_adapters="` + strings.Repeat("n", gateway.MaxAdapterName+1) + `,ok"} 1`),
			&gateway.AdapterReport{Running: []string{"ok"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, rep, err := parseEngineScrape(strings.NewReader(tc.page))
			require.NoError(t, err)
			require.Equal(t, tc.want, rep)
		})
	}
}

func TestParseModelList(t *testing.T) {
	simList := `{"object":"list","data":[{"id":"m","object":"model","created":1796079723,"owned_by":"vllm","root":"m","parent":null,"max_model_len":1024},{"id":"b","object":"model","root":"/x/b","parent":"m"},{"id":"a","object":"model","root":"/x/a","parent":"m"}]}`
	got, err := parseModelList([]byte(simList))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"a": "m", "b": "m"}, got.parents, "llm-d-inference-sim v0.10.2's list")
	require.Zero(t, got.skipped)
	got, err = parseModelList([]byte(`{"data":[{"id":"m"},{"id":"x","parent":""}]}`))
	require.NoError(t, err)
	require.Empty(t, got.parents, "no parent, empty parent: not adapters")
	for _, bad := range []string{``, `[]`, `{}`, `{"data":{}}`, `{"data":[]} x`} {
		_, err := parseModelList([]byte(bad))
		require.ErrorIs(t, err, errModelList, bad)
	}
	// A bad entry is skipped and counted; the others stand.
	for _, entry := range []string{`{"parent":"m"}`, `{"id":""}`, `{"id":"a","parent":3}`, `{"id":7}`, `"x"`, `null`, `[1]`} {
		body := `{"data":[{"id":"good","parent":"m"},` + entry + `,{"id":"also","parent":"m"}]}`
		got, err := parseModelList([]byte(body))
		require.NoError(t, err, body)
		require.Equal(t, map[string]string{"good": "m", "also": "m"}, got.parents, body)
		require.Equal(t, 1, got.skipped, body)
		require.ErrorIs(t, got.bad, errModelList, body)
		require.Contains(t, got.bad.Error(), "data[1]", body)
	}
}

// FuzzParseLoRAInfo: any page the parser accepts yields a report the
// gateway accepts.
func FuzzParseLoRAInfo(f *testing.F) {
	for _, name := range []string{"llm-d-inference-sim-v0.10.2-lora-busy.txt", "llm-d-inference-sim-v0.10.2-busy.txt"} {
		b, err := os.ReadFile("testdata/metrics/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add(loraPage(`vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"} 7`))
	f.Add(loraPage(`vllm:lora_requests_info{max_lora="99999999999",running_lora_adapters=",,"} NaN`))
	f.Fuzz(func(t *testing.T, page string) {
		_, rep, err := parseEngineScrape(strings.NewReader(page))
		if err != nil || rep == nil {
			return
		}
		g, gerr := gateway.New([]gateway.Replica{{Name: "r"}})
		require.NoError(t, gerr)
		require.NoError(t, g.UpdateAdapters("r", *rep))
	})
}

// FuzzParseModelList: the parser never panics, and what it returns is
// what encoding/json reads as entries with a string parent.
func FuzzParseModelList(f *testing.F) {
	f.Add(`{"object":"list","data":[{"id":"m","parent":null},{"id":"a","parent":"m"}]}`)
	f.Add(`{"data":[{"id":"a","parent":"m","parent":null}]}`)
	f.Add(`{"data":[{"id":"a","Parent":"m"}]}`)
	f.Add(`{"data":[]}`)
	f.Add(`{"data":[{"id":"a","parent":"m"},{"id":7},"x",{"id":"b","parent":3},{"id":"c","parent":"m"}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		got, err := parseModelList([]byte(body))
		if err != nil {
			return
		}
		var doc struct {
			Data []json.RawMessage `json:"data"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &doc))
		want, skipped := map[string]string{}, 0
		for _, raw := range doc.Data {
			var e struct {
				ID     *string `json:"id"`
				Parent *string `json:"parent"`
			}
			if json.Unmarshal(raw, &e) != nil || e.ID == nil || *e.ID == "" || len(*e.ID) > gateway.MaxAdapterName {
				skipped++
				continue
			}
			if e.Parent != nil && *e.Parent != "" {
				want[*e.ID] = *e.Parent
			}
		}
		require.Equal(t, want, got.parents)
		require.Equal(t, skipped, got.skipped)
	})
}

// TestLoRAPageParsesAsText keeps the captured page a valid exposition.
func TestLoRAPageParsesAsText(t *testing.T) {
	b, err := os.ReadFile("testdata/metrics/llm-d-inference-sim-v0.10.2-lora-busy.txt")
	require.NoError(t, err)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	require.NoError(t, err)
	require.Len(t, fams[metricLoRAInfo].GetMetric(), 7)
}

// TestAdapterTable: ownership when two models' engines list one adapter.
func TestAdapterTable(t *testing.T) {
	ep := func(parents map[string]string) *Endpoint {
		e := NewEndpoint("http://x")
		e.lora.served.Store(&servedAdapters{parents: parents})
		return e
	}
	e1 := ep(map[string]string{"shared": "B", "only1": "A", "B": "A"})
	e2 := ep(map[string]string{"shared": "B"})
	st := &State{Models: map[string]*Model{
		"A": {Name: "A", Order: []string{"r1"}, ByName: map[string]*Endpoint{"r1": e1}},
		"B": {Name: "B", Order: []string{"r2"}, ByName: map[string]*Endpoint{"r2": e2}},
	}}
	tab := buildAdapterTable(st)
	require.Equal(t, "B", tab.byName["shared"].Model.Name, "its parent's")
	require.Equal(t, map[string]bool{"r2": true}, tab.byName["shared"].Eligible)
	require.Equal(t, "A", tab.byName["only1"].Model.Name)
	require.NotContains(t, tab.byName, "B", "a configured model's name is the model")
}

// TestParseModelEntryParent: a parent that is not a string or null is
// refused naming the entry's id, also when a later "parent" member is a
// string (encoding/json refuses that entry; the last value does not win).
func TestParseModelEntryParent(t *testing.T) {
	for _, raw := range []string{`{"id":"a","parent":3}`, `{"id":"a","parent":3,"parent":"m"}`, `{"id":"a","pArent":{},"parent":"m"}`} {
		_, _, err := parseModelEntry(json.RawMessage(raw))
		require.EqualError(t, err, `id "a": parent must be a string or null`, raw)
	}
	id, parent, err := parseModelEntry(json.RawMessage(`{"id":"a","parent":"m"}`))
	require.NoError(t, err)
	require.Equal(t, []string{"a", "m"}, []string{id, parent})
	_, _, err = parseModelEntry(json.RawMessage(`{"id":7,"parent":"m"}`))
	require.ErrorContains(t, err, "not an object with a string id")
}

// TestAdapterTableListedBeatsAllowed: an adapter that one model's engines
// list belongs to that model, whichever sorts first, rather than to a
// model whose allow-list names it but whose engines do not list it (the
// rule for an allowed adapter applies when no engine lists it).
func TestAdapterTableListedBeatsAllowed(t *testing.T) {
	for _, names := range [][2]string{{"A", "B"}, {"B", "A"}} {
		allows, lists := names[0], names[1]
		other := NewEndpoint("http://x")
		other.lora.served.Store(&servedAdapters{parents: map[string]string{"y": "base"}})
		serving := NewEndpoint("http://z")
		serving.lora.served.Store(&servedAdapters{parents: map[string]string{"x": "base"}})
		st := &State{Models: map[string]*Model{
			allows: {Name: allows, Cfg: config.Model{Adapters: []string{"x", "y"}}, Order: []string{"r1"}, ByName: map[string]*Endpoint{"r1": other}},
			lists:  {Name: lists, Order: []string{"r2"}, ByName: map[string]*Endpoint{"r2": serving}},
		}}
		st.Adapters = buildAdapterTable(st)
		r, err := st.AdapterRoute("x")
		require.NoError(t, err)
		require.Equal(t, lists, r.Model.Name, "x: %s allows it, %s's engines list it", allows, lists)
		require.Equal(t, map[string]bool{"r2": true}, r.Eligible)
		r, err = st.AdapterRoute("y")
		require.NoError(t, err)
		require.Equal(t, allows, r.Model.Name)
	}
}

// TestPropAdapterTable: buildAdapterTable resolves every name as
// docs/lora.md says, checked against an oracle over random models,
// engines' lists (parents included) and allow-lists. A configured model's
// name is never an adapter. An adapter that engines of models allowing it
// list belongs to the first such model by name that one of its engines
// names as the parent, else to the first such model, and is routed over
// that model's replicas listing it. One that no allowing model's engines
// list belongs to the first model whose allow-list names it, over all its
// replicas; else, listed only by refusing models' engines, it is refused
// (404 naming the allow-list); else unknown (404).
func TestPropAdapterTable(t *testing.T) {
	models := []string{"A", "B", "C"}
	adapters := []string{"x", "y", "A"}
	rapid.Check(t, func(t *rapid.T) {
		st := &State{Models: map[string]*Model{}}
		lists := map[string]map[string]map[string]string{} // model → replica → adapter → parent
		for _, m := range rapid.SliceOfNDistinct(rapid.SampledFrom(models), 1, 3, rapid.ID[string]).Draw(t, "models") {
			ms := &Model{Name: m, ByName: map[string]*Endpoint{}}
			ms.Cfg.Adapters = rapid.SliceOfDistinct(rapid.SampledFrom([]string{"x", "y"}), rapid.ID[string]).Draw(t, "allow")
			lists[m] = map[string]map[string]string{}
			for i := range rapid.IntRange(1, 2).Draw(t, "replicas") {
				rname := fmt.Sprintf("%s%d", m, i)
				parents := map[string]string{}
				for _, a := range adapters {
					if p := rapid.SampledFrom([]string{"", "A", "B", "C", "base"}).Draw(t, "parent"); p != "" {
						parents[a] = p
					}
				}
				ep := NewEndpoint("http://" + rname)
				ep.lora.served.Store(&servedAdapters{parents: parents})
				ms.Order, ms.ByName[rname] = append(ms.Order, rname), ep
				lists[m][rname] = parents
			}
			st.Models[m] = ms
		}
		st.Adapters = buildAdapterTable(st)
		names := slices.Sorted(maps.Keys(st.Models))
		for _, a := range adapters {
			r, err := st.AdapterRoute(a)
			if st.Models[a] != nil {
				require.ErrorIs(t, err, ErrModelNotFound, "%s is a model", a)
				continue
			}
			allowed := func(m string) bool {
				return len(st.Models[m].Cfg.Adapters) == 0 || slices.Contains(st.Models[m].Cfg.Adapters, a)
			}
			owner, parentOwner, refused, allowing := "", "", "", ""
			for _, m := range names {
				listed, named := false, false
				for _, parents := range lists[m] {
					if p, ok := parents[a]; ok {
						listed, named = true, named || p == m
					}
				}
				switch {
				case listed && !allowed(m):
					refused = cmp.Or(refused, m)
				case listed:
					owner = cmp.Or(owner, m)
					if named {
						parentOwner = cmp.Or(parentOwner, m)
					}
				}
				if slices.Contains(st.Models[m].Cfg.Adapters, a) {
					allowing = cmp.Or(allowing, m)
				}
			}
			owner = cmp.Or(parentOwner, owner)
			switch {
			case owner != "":
				require.NoError(t, err, a)
				require.Equal(t, owner, r.Model.Name, "%s: lists %v", a, lists)
				want := map[string]bool{}
				for rname, parents := range lists[owner] {
					if _, ok := parents[a]; ok {
						want[rname] = true
					}
				}
				require.Equal(t, want, r.Eligible, a)
			case allowing != "":
				require.NoError(t, err, a)
				require.Equal(t, allowing, r.Model.Name, a)
				require.Nil(t, r.Eligible, "%s: no engine lists it: all the model's replicas", a)
			case refused != "":
				require.ErrorIs(t, err, ErrModelNotFound, a)
				require.ErrorContains(t, err, "allow-list", a)
			default:
				require.ErrorIs(t, err, ErrModelNotFound, a)
				require.ErrorContains(t, err, "neither a configured model nor a LoRA adapter", a)
			}
		}
	})
}
