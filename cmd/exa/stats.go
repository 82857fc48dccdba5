package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/examlops/gateway/config"
	"github.com/spf13/cobra"
)

// gatewayEnv names the environment variable that supplies --gateway's default.
const gatewayEnv = "EXA_GATEWAY"

// statsTimeout bounds the request to a gateway's /stats.
const statsTimeout = 5 * time.Second

func newStatsCmd() *cobra.Command {
	var (
		gatewayURL string
		asJSON     bool
	)
	cmd := &cobra.Command{
		Use:   "stats MODEL",
		Short: "Show a model's configuration and routing statistics (live or simulated)",
		Long: `Show a model's routing configuration and its routing statistics: decisions by
kind (affinity, load_aware, round_robin), hit rate, share of requests per
replica, SLO exclusions and fallbacks.

The statistics come from a running gateway when --gateway (default
$EXA_GATEWAY) names one; otherwise from the latest
"exa serve routing simulate MODEL", labelled simulated. A gateway that cannot
be reached, or answers GET URL/stats with an error, fails the command (exit
status 1); one that does not serve the model falls back to the simulation.
If neither exists the command says so.`,
		Example:           "  exa serve routing stats JPCP\n  exa serve routing stats JPCP --gateway http://127.0.0.1:8080\n  exa serve routing stats JPCP --json",
		Args:              modelArg,
		ValidArgsFunction: completeModels,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runStats(cmd, args[0], gatewayURL, asJSON)
		},
	}
	cmd.Flags().StringVar(&gatewayURL, "gateway", os.Getenv(gatewayEnv), "base URL of a running gateway to read live statistics from (default $"+gatewayEnv+")")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the configuration and statistics as JSON")
	_ = cmd.RegisterFlagCompletionFunc("gateway", cobra.NoFileCompletions)
	return cmd
}

// statsOutput is the --json form of stats.
type statsOutput struct {
	Model      string               `json:"model"`
	Configured bool                 `json:"configured"`
	Config     config.Model         `json:"config"`
	Stats      *config.RoutingStats `json:"stats"`
	// Note explains missing or fallback statistics; "" otherwise.
	Note string `json:"note,omitempty"`
}

func runStats(cmd *cobra.Command, model, gatewayURL string, asJSON bool) error {
	path, f, err := loadConfig()
	if err != nil {
		return err
	}
	m, configured := f.Models[model]
	out := statsOutput{Model: model, Configured: configured, Config: m}

	var notes []string
	if gatewayURL != "" {
		rec, err := fetchGatewayStats(cmd.Context(), gatewayURL, model)
		var ue *usageError
		if errors.As(err, &ue) {
			return err
		}
		switch {
		case err == nil:
			out.Stats = &rec
		case errors.Is(err, config.ErrNotServed):
			notes = append(notes, fmt.Sprintf("no live statistics from gateway %s: %v", gatewayURL, err))
		default:
			// The gateway asked for did not answer (or answered with an
			// error): fail rather than show other figures.
			return fmt.Errorf("gateway %s: %w (for the simulated statistics, leave out --gateway and $%s)", printable(gatewayURL), err, gatewayEnv)
		}
	}
	if out.Stats == nil {
		rec, err := config.LoadStats(path, model)
		switch {
		case err == nil:
			out.Stats = &rec
		case errors.Is(err, config.ErrNoStats):
			if gatewayURL == "" {
				notes = append(notes, "no gateway given (--gateway URL or $"+gatewayEnv+")")
			}
			notes = append(notes, fmt.Sprintf("no simulation of %s yet (run: exa serve routing simulate %s)", model, model))
		default:
			return err
		}
	}
	out.Note = strings.Join(notes, "; ")

	w := cmd.OutOrStdout()
	if asJSON {
		return writeJSON(w, out)
	}
	if configured {
		describe(w, model, m)
	} else {
		fmt.Fprintf(w, "model %s has no stored routing configuration in %s (defaults apply: round_robin, no SLO)\n", model, path)
	}
	fmt.Fprintln(w)
	if out.Stats == nil {
		fmt.Fprintf(w, "no routing statistics for %s: %s\n", model, out.Note)
		return nil
	}
	if out.Note != "" {
		fmt.Fprintf(w, "note: %s\n", out.Note)
	}
	writeStats(w, *out.Stats, gatewayURL)
	return nil
}

// fetchGatewayStats reads GET base/stats and returns the model's record.
// The body is a config.StatsDocument, or a single config.RoutingStats.
func fetchGatewayStats(ctx context.Context, base, model string) (config.RoutingStats, error) {
	u, err := url.Parse(strings.TrimRight(base, "/") + "/stats")
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return config.RoutingStats{}, usagef("invalid --gateway %q: want an http:// or https:// URL", base)
	}
	q := u.Query()
	q.Set("model", model)
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithTimeout(ctx, statsTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return config.RoutingStats{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return config.RoutingStats{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return config.RoutingStats{}, err
	}
	if resp.StatusCode == http.StatusNotFound {
		return config.RoutingStats{}, fmt.Errorf("%w %q", config.ErrNotServed, model)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
			return config.RoutingStats{}, fmt.Errorf("GET %s: %s: %q", u, printable(resp.Status), e.Error.Message)
		}
		return config.RoutingStats{}, fmt.Errorf("GET %s: %s", u, printable(resp.Status))
	}
	rec, err := config.DecodeGatewayStats(body, model)
	if err != nil && !errors.Is(err, config.ErrNotServed) {
		return config.RoutingStats{}, fmt.Errorf("GET %s: %v", u, err)
	}
	return rec, err
}

// writeStats prints a statistics record. Its strings may come from the
// network (a gateway's /stats) or a hand-edited file: they are printed
// through printable, so they cannot drive the terminal.
func writeStats(w io.Writer, s config.RoutingStats, gatewayURL string) {
	switch s.Source {
	case config.SourceGateway:
		fmt.Fprintf(w, "routing statistics (live, from gateway %s):\n", printable(gatewayURL))
	default:
		fmt.Fprintf(w, "routing statistics (simulated; run \"exa serve routing simulate\" again to refresh):\n")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	if s.Workload != "" {
		fmt.Fprintf(tw, "workload:\t%s\n", printable(s.Workload))
	}
	if s.Mode != "" {
		fmt.Fprintf(tw, "policy:\t%s\n", printable(s.Mode))
	}
	if s.Index != "" {
		fmt.Fprintf(tw, "index:\t%s\n", printable(s.Index))
	}
	fmt.Fprintf(tw, "requests:\t%d\n", s.Requests)
	fmt.Fprintf(tw, "hit rate:\t%s of prompt blocks cached on the chosen replica (%d of %d, by the router's index)\n", pct(s.BlockHitRate), s.MatchedBlocks, s.Blocks)
	fmt.Fprintf(tw, "whole-prompt hits:\t%s of requests (%d of %d)\n", pct(s.HitRate), s.Hits, s.Requests)
	if s.Source == config.SourceSimulated {
		fmt.Fprintf(tw, "token hit rate:\t%s of prompt tokens served from the simulated engines' caches\n", pct(s.TokenHitRate))
	}
	var parts []string
	for _, k := range []string{"affinity", "load_aware", "round_robin"} {
		parts = append(parts, fmt.Sprintf("%s %d (%s)", k, s.Decisions[k], pct(ratio(s.Decisions[k], s.Requests))))
	}
	fmt.Fprintf(tw, "decisions:\t%s\n", strings.Join(parts, ", "))
	fmt.Fprintf(tw, "slo exclusions:\t%d\n", s.SLOExcluded)
	fmt.Fprintf(tw, "fallbacks:\tslo %d, no match %d, load guard %d, no healthy replica %d\n", s.SLOFallbacks, s.NoMatch, s.LoadGuard, s.NoHealthy)
	if o := s.Objectives; o != nil {
		fmt.Fprintf(tw, "latency objectives:\t%d requests, %d with none predicted to meet theirs; ttft met %d, missed %d; tpot met %d, missed %d\n",
			o.Requests, o.BestEffort, o.TTFTMet, o.TTFTMissed, o.TPOTMet, o.TPOTMissed)
	}
	if d := s.Disaggregation; d != nil {
		fmt.Fprintf(tw, "p/d split:\t%d of %d requests (%s), %s mode, at %d uncached prompt tokens or more\n",
			d.Split, d.Decided, pct(d.SplitShare), printable(d.Mode), d.MinUncachedTokens)
		fmt.Fprintf(tw, "p/d fallbacks:\tprefill unavailable %d, prefill failed %d, no kv_transfer_params %d, decode retried %d, prefill retried %d\n",
			d.Fallbacks["prefill_unavailable"], d.Fallbacks["prefill_failed"], d.Fallbacks["prefill_no_kv_params"], d.Fallbacks["decode_retry"], d.Fallbacks["prefill_retry"])
	}
	_ = tw.Flush()
	writeReplicas(w, s)
	if d := s.Disaggregation; d != nil && d.Prefill != nil {
		fmt.Fprintf(w, "prefill pool: %d requests, %s of prompt blocks cached on the chosen replica\n", d.Prefill.Requests, pct(d.Prefill.BlockHitRate))
		writeReplicas(w, *d.Prefill)
	}
}

// writeReplicas writes the replica table of a record (for a
// disaggregated model's record, its decode pool).
func writeReplicas(w io.Writer, s config.RoutingStats) {
	if len(s.Replicas) == 0 {
		fmt.Fprintln(w, "replicas: none")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	if s.Source == config.SourceSimulated {
		fmt.Fprintln(tw, "REPLICA\tREQUESTS\tSHARE\tHITS\tPREFILL TOKENS\t")
		for _, r := range s.Replicas {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t\n", printable(r.Name), r.Routed, pct(r.Share), r.Hits, r.PrefillTokens)
		}
	} else {
		fmt.Fprintln(tw, "REPLICA\tREQUESTS\tSHARE\tHITS\tHEALTHY\tCACHED BLOCKS\t")
		for _, r := range s.Replicas {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%d\t\n", printable(r.Name), r.Routed, pct(r.Share), r.Hits, yesNo(r.Healthy), r.CachedBlocks)
		}
	}
	_ = tw.Flush()
	if s.KVEvents != nil {
		writeKVStats(w, s.KVEvents)
	}
}

// writeKVStats prints the exact index's figures of a model: tokenization,
// fallbacks, and each engine's KV events. Strings come from the network.
func writeKVStats(w io.Writer, k *config.KVEventsStats) {
	fmt.Fprintf(w, "\nexact index (blocks of %d tokens, kept current by the engines' KV events):\n", k.BlockSize)
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	t := k.Tokenize
	cached := uint64(0)
	if t.Requests > t.EngineCalls {
		cached = t.Requests - t.EngineCalls
	}
	fmt.Fprintf(tw, "tokenized:\t%d requests: %d calls to an engine's /tokenize, %d from the gateway's cache, %d errors\n", t.Requests, t.EngineCalls, cached, t.Errors)
	var parts []string
	for _, r := range []string{"tokenize_error", "short_prompt", "unsupported"} {
		parts = append(parts, fmt.Sprintf("%s %d", r, k.Fallbacks[r]))
	}
	fmt.Fprintf(tw, "routed without tokens:\t%s (as if nothing were cached)\n", strings.Join(parts, ", "))
	_ = tw.Flush()
	if len(k.Engines) == 0 {
		fmt.Fprintln(w, "engines: none heard yet")
	} else {
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "ENGINE\tREPLICAS\tEVENTS\tAPPLIED\tDROPPED\tSTORED\tREMOVED\tMAPPED\tGAPS\tRESTARTS\tCLEARS\tRESETS\t")
		for _, e := range k.Engines {
			name := e.Topic
			if name == "" {
				name = e.Endpoint
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", printable(name), printable(strings.Join(e.Replicas, ",")),
				e.Events, e.Applied, e.Dropped, e.StoredBlocks, e.RemovedBlocks, e.MappedBlocks, e.Gaps, e.Restarts, e.Clears, e.Resets)
		}
		_ = tw.Flush()
		for _, e := range k.Engines {
			if len(e.DroppedBy) > 0 {
				var by []string
				for _, r := range slices.Sorted(maps.Keys(e.DroppedBy)) {
					by = append(by, fmt.Sprintf("%s %d", printable(r), e.DroppedBy[r]))
				}
				fmt.Fprintf(w, "  %s dropped: %s\n", printable(cmp.Or(e.Topic, e.Endpoint)), strings.Join(by, ", "))
			}
			if e.ReplayAttempts+e.ReplaySucceeded+e.ReplayFailed+e.ReplayedBatches > 0 {
				fmt.Fprintf(w, "  %s replays: %d gaps asked for, %d filled, %d failed (engine cleared), %d batches recovered\n",
					printable(cmp.Or(e.Topic, e.Endpoint)), e.ReplayAttempts, e.ReplaySucceeded, e.ReplayFailed, e.ReplayedBatches)
			}
			if e.LastError != "" {
				fmt.Fprintf(w, "  %s last error: %s\n", printable(cmp.Or(e.Topic, e.Endpoint)), printable(e.LastError))
			}
		}
	}
	for _, ep := range k.Endpoints {
		if ep.Bound {
			fmt.Fprintf(w, "events: listening on %s, %d publisher connections ended", printable(ep.Endpoint), ep.Failures)
		} else {
			state := "disconnected"
			if ep.Connected {
				state = "connected"
			}
			fmt.Fprintf(w, "events: connecting to %s: %s, %d connections, %d failures", printable(ep.Endpoint), state, ep.Connects, ep.Failures)
		}
		if ep.LastError != "" {
			fmt.Fprintf(w, " (last: %s)", printable(ep.LastError))
		}
		fmt.Fprintln(w)
	}
}

func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

func ratio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func init() {
	routingCmd.AddCommand(newStatsCmd())
}
