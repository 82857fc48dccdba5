package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/spf13/cobra"
)

func newGetCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:               "get MODEL",
		Short:             "Show a model's stored routing configuration",
		Example:           "  exa serve routing get JPCP\n  exa serve routing get JPCP --json",
		Args:              modelArg,
		ValidArgsFunction: completeModels,
		RunE: func(cmd *cobra.Command, args []string) error {
			path, f, err := loadConfig()
			if err != nil {
				return err
			}
			m, ok := f.Models[args[0]]
			if !ok {
				return fmt.Errorf("no routing configuration for model %q in %s (create it with: exa serve routing set %s)", args[0], path, args[0])
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), m)
			}
			describe(cmd.OutOrStdout(), args[0], m)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the model's configuration as JSON")
	return cmd
}

func newListCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List the models with a stored routing configuration",
		Example: "  exa serve routing list\n  exa serve routing list --json",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			path, f, err := loadConfig()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, f.Models)
			}
			if len(f.Models) == 0 {
				fmt.Fprintf(out, "no models configured in %s\n", path)
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MODEL\tMODE\tSLO\tDISAGGREGATE\tREPLICAS\tPOOLS")
			for _, name := range f.Names() {
				m := f.Models[name]
				pools := slices.Sorted(maps.Keys(m.Pools))
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", name, m.Mode, sloText(m), onOff(m.Disaggregate), len(m.Replicas), orDash(strings.Join(pools, ",")))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print all models' configurations as JSON")
	return cmd
}

func newDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "delete MODEL",
		Short:             "Remove a model's routing configuration",
		Example:           "  exa serve routing delete JPCP",
		Args:              modelArg,
		ValidArgsFunction: completeModels,
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := configPath()
			if err != nil {
				return err
			}
			err = config.Update(path, func(f *config.File) error {
				if _, ok := f.Models[args[0]]; !ok {
					return fmt.Errorf("no routing configuration for model %q in %s", args[0], path)
				}
				delete(f.Models, args[0])
				return nil
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %s from %s\n", args[0], path)
			return nil
		},
	}
}

// loadConfig reads the configuration in use.
func loadConfig() (string, *config.File, error) {
	path, err := configPath()
	if err != nil {
		return "", nil, err
	}
	f, err := config.Load(path)
	return path, f, err
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// describe writes a model's configuration, one field a line.
func describe(w io.Writer, name string, m config.Model) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "model:\t%s\n", name)
	fmt.Fprintf(tw, "mode:\t%s\n", m.Mode)
	fmt.Fprintf(tw, "slo latency:\t%s\n", sloText(m))
	if m.LoadWeights != nil {
		fmt.Fprintf(tw, "load weights:\t%s\n", weightsText(m.LoadWeights.Gateway()))
	} else {
		fmt.Fprintf(tw, "load weights:\t%s (default)\n", weightsText(gateway.DefaultLoadWeights()))
	}
	if m.Disaggregate {
		fmt.Fprintf(tw, "disaggregate:\ton (prefill pool %q, decode pool %q)\n", m.PrefillPool, m.DecodePool)
		def := ""
		if m.PDMinUncachedTokens == nil {
			def = " (default)"
		}
		fmt.Fprintf(tw, "p/d split:\t%s mode, at %d uncached prompt tokens or more%s\n", m.PDModeName(), m.MinUncachedTokens(), def)
	} else if m.PrefillPool != "" || m.DecodePool != "" {
		fmt.Fprintf(tw, "disaggregate:\toff (pools %q and %q kept)\n", m.PrefillPool, m.DecodePool)
	} else {
		fmt.Fprintf(tw, "disaggregate:\toff\n")
	}
	fmt.Fprintf(tw, "index:\t%s\n", indexText(m))
	if m.Engine != config.EngineAuto {
		fmt.Fprintf(tw, "engine:\t%s (its metric names are read for load)\n", m.Engine)
	}
	if len(m.Adapters) > 0 {
		fmt.Fprintf(tw, "adapters:\t%s (allow-list)\n", strings.Join(m.Adapters, ", "))
	}
	if len(m.Peers) > 0 {
		fmt.Fprintf(tw, "peers:\t%s (their pending prefill is added to this gateway's)\n", strings.Join(m.Peers, ", "))
	}
	if len(m.KVEventsAllow) > 0 {
		fmt.Fprintf(tw, "events from:\t%s (may publish KV events besides the replicas' hosts)\n", strings.Join(m.KVEventsAllow, ", "))
	}
	fmt.Fprintf(tw, "replicas:\t%s\n", replicasText(m.Replicas))
	for _, p := range slices.Sorted(maps.Keys(m.Pools)) {
		fmt.Fprintf(tw, "pool %s:\t%s\n", p, replicasText(m.Pools[p]))
	}
	_ = tw.Flush()
}

// indexText describes the model's cache index and, for the exact index,
// its block size and where its events come from.
func indexText(m config.Model) string {
	if !m.Exact() {
		s := m.IndexName()
		if m.KVEventsBind != "" || m.BlockSize != 0 {
			s += fmt.Sprintf(" (kept for the exact index: blocks of %d tokens", m.TokenBlockSize())
			if m.KVEventsBind != "" {
				s += ", events on " + m.KVEventsBind
			}
			s += ")"
		}
		return s
	}
	s := fmt.Sprintf("exact (KV events, blocks of %d tokens", m.TokenBlockSize())
	if m.KVEventsBind != "" {
		s += "; listening on " + m.KVEventsBind
	}
	return s + ")"
}

func sloText(m config.Model) string {
	if m.SLOLatencyMS == 0 {
		return "none"
	}
	return m.SLOLatency().String()
}

func weightsText(w gateway.LoadWeights) string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	return "queue=" + f(w.Queue) + " kv=" + f(w.KV) + " latency=" + f(w.Latency)
}

func replicasText(rs []config.Replica) string {
	if len(rs) == 0 {
		return "none"
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.Name + "=" + r.Address
		var notes []string
		if r.CacheBlocks > 0 {
			notes = append(notes, fmt.Sprintf("%d blocks", r.CacheBlocks))
		}
		if r.KVEvents != "" {
			notes = append(notes, "events from "+r.KVEvents)
		}
		if r.KVEventsReplay != "" {
			notes = append(notes, "replay from "+r.KVEventsReplay)
		}
		if r.Pod != "" {
			notes = append(notes, "pod "+r.Pod)
		}
		if len(notes) > 0 {
			parts[i] += " (" + strings.Join(notes, ", ") + ")"
		}
	}
	return strings.Join(parts, ", ")
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// completeModels completes MODEL from the stored configuration.
func completeModels(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	_, f, err := loadConfig()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return f.Names(), cobra.ShellCompDirectiveNoFileComp
}

func init() {
	routingCmd.AddCommand(newSetCmd(), newGetCmd(), newListCmd(), newDeleteCmd())
}
