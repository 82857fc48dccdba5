package main

import (
	"fmt"
	"strings"

	"github.com/examlops/gateway/config"
	"github.com/spf13/cobra"
)

// rootCmd is the exa command.
var rootCmd = &cobra.Command{
	Use:           "exa",
	Short:         "Operate the cache-aware LLM gateway",
	Long:          "exa configures, simulates and inspects the routing of LLM requests across model-server replicas.",
	SilenceErrors: true,
	SilenceUsage:  true,
	Args:          groupArgs,
	RunE:          groupRun,
}

// serveCmd groups the serving commands. Other files add subcommands to it
// in their init functions (routing here; gateway in gateway.go).
var serveCmd = &cobra.Command{
	Use:   "serve",
	Short: "Serve models and configure their routing",
	Args:  groupArgs,
	RunE:  groupRun,
}

// routingCmd groups the routing configuration commands.
var routingCmd = &cobra.Command{
	Use:   "routing",
	Short: "Configure, simulate and inspect request routing per model",
	Long: `Configure, simulate and inspect request routing per model.

The configuration is one JSON file: --config if given, else $EXA_CONFIG if set,
else routing.json in the exa directory of the user's configuration directory
(~/.config/exa/routing.json on Linux). Writes are atomic and serialised across
processes, so concurrent "set" commands never lose an update.`,
	Args: groupArgs,
	RunE: groupRun,
}

// configFlag holds --config.
var configFlag string

// groupArgs accepts anything; groupRun reports unknown subcommands.
func groupArgs(*cobra.Command, []string) error { return nil }

func init() {
	rootCmd.SetFlagErrorFunc(flagError)
	rootCmd.CompletionOptions.HiddenDefaultCmd = false
	rootCmd.Version = buildVersion()
	routingCmd.PersistentFlags().StringVar(&configFlag, "config", "", "routing configuration file (default $EXA_CONFIG, else the user config dir's exa/routing.json)")
	serveCmd.AddCommand(routingCmd)
	rootCmd.AddCommand(serveCmd)
	initCompletionCmd()
}

// initCompletionCmd adds cobra's completion command now, rather than when
// it first runs, and makes an unknown shell a usage error listing the
// supported ones (cobra prints the help and exits 0).
func initCompletionCmd() {
	rootCmd.InitDefaultCompletionCmd()
	for _, c := range rootCmd.Commands() {
		if c.Name() != "completion" {
			continue
		}
		var shells []string
		for _, sub := range c.Commands() {
			shells = append(shells, sub.Name())
		}
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown shell %q for %q: want one of %s", args[0], cmd.CommandPath(), strings.Join(shells, ", "))
			}
			return cmd.Help()
		}
	}
}

// configPath returns the configuration file in use.
func configPath() (string, error) {
	if configFlag != "" {
		return configFlag, nil
	}
	p, err := config.Path()
	if err != nil {
		return "", fmt.Errorf("%w (or pass --config)", err)
	}
	return p, nil
}
