package main

import (
	"context"
	"log/slog"
	"os"
	"regexp"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/httpgw"
	"github.com/examlops/gateway/k8s"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// discoveryFlags select Kubernetes discovery of the replicas (package
// k8s): an InferencePool's pods (--pool-name, as GIE's endpoint picker)
// or a Service's EndpointSlices (--service).
type discoveryFlags struct {
	poolName, poolNamespace, poolGroup string
	service, servicePort               string
	poolModels                         []string
	kubeconfig                         string
	// selector and ports are GIE's standalone mode, the picker's
	// --endpoint-selector and --endpoint-target-ports (gieflags.go): the
	// pods matching selector; nil otherwise.
	selector map[string]string
	ports    []int
	// staleness is the picker's --metrics-staleness-threshold (GIE's
	// flag), 0 elsewhere: the pool series then take GIE's default.
	staleness time.Duration
}

// register declares the discovery flags on f.
func (d *discoveryFlags) register(f *pflag.FlagSet) {
	f.StringVar(&d.poolName, "pool-name", "", "discover the replicas from this InferencePool's ready pods (inference.networking.k8s.io/v1, as GIE's endpoint picker); \"\" = replicas from the configuration file only")
	f.StringVar(&d.poolNamespace, "pool-namespace", "", "namespace of --pool-name or --service (default $NAMESPACE, else \"default\")")
	f.StringVar(&d.poolGroup, "pool-group", k8s.DefaultPoolGroup, "API group of the InferencePool; only "+k8s.DefaultPoolGroup+" is supported")
	f.StringVar(&d.service, "service", "", "discover the replicas from this Service's ready EndpointSlice endpoints (instead of --pool-name)")
	f.StringVar(&d.servicePort, "service-port", "", "name of the EndpointSlice port of --service (default: each slice's first port)")
	f.StringArrayVar(&d.poolModels, "pool-model", nil, "model served by the discovered replicas (repeatable); a model missing from the configuration is routed cache_aware; default: every model of the configuration file that is not disaggregated")
	f.StringVar(&d.kubeconfig, "kubeconfig", "", "kubeconfig file of the cluster (default: in-cluster service account, else $KUBECONFIG or ~/.kube/config)")
}

// enabled reports whether discovery was asked for.
func (d *discoveryFlags) enabled() bool {
	return d.poolName != "" || d.service != "" || d.selector != nil
}

// sourceName names what discovery reads, for the pool's metric series and
// its Lease: the pool, the Service, or in standalone mode the picker's
// Deployment, from $POD_NAME as GIE v1.5.0 names it (cmd/epp/runner
// extractDeploymentName; GIE's chart sets POD_NAME), else "standalone".
func (d *discoveryFlags) sourceName() string {
	switch {
	case d.poolName != "":
		return d.poolName
	case d.service != "":
		return d.service
	}
	if m := deploymentOfPod.FindStringSubmatch(os.Getenv("POD_NAME")); m != nil {
		return m[1]
	}
	return "standalone"
}

// deploymentOfPod is GIE's pattern of a Deployment's pod name.
var deploymentOfPod = regexp.MustCompile(`^(.+)-[a-z0-9]+-[a-z0-9]+$`)

// validate returns a usage error for conflicting discovery flags, and for
// --pool-model, --pool-namespace, --kubeconfig and --service-port set
// where discovery would not read them.
func (d *discoveryFlags) validate() error {
	if d.poolName != "" && d.service != "" {
		return usagef("invalid --service %q: --pool-name %q is set; discover from one source", d.service, d.poolName)
	}
	if d.selector != nil && (d.poolName != "" || d.service != "") {
		return usagef("invalid --endpoint-selector: --pool-name %q or --service %q is set; discover from one source", d.poolName, d.service)
	}
	// Flags that only discovery reads: without it they would be ignored.
	if d.servicePort != "" && d.service == "" {
		return usagef("invalid --service-port %q: needs --service (an InferencePool's ports are its targetPorts)", d.servicePort)
	}
	if !d.enabled() {
		first := ""
		if len(d.poolModels) > 0 {
			first = d.poolModels[0]
		}
		for _, f := range []struct {
			name, v string
			set     bool
		}{{"pool-model", first, len(d.poolModels) > 0}, {"pool-namespace", d.poolNamespace, d.poolNamespace != ""}, {"kubeconfig", d.kubeconfig, d.kubeconfig != ""}} {
			if f.set {
				return usagef("invalid --%s %q: needs --pool-name or --service (without discovery the replicas come from the configuration file)", f.name, f.v)
			}
		}
	}
	if d.poolGroup != k8s.DefaultPoolGroup {
		return usagef("invalid --pool-group %q: only %s (InferencePool v1) is supported", d.poolGroup, k8s.DefaultPoolGroup)
	}
	for _, m := range d.poolModels {
		if err := config.ValidateModelName(m); err != nil {
			return usagef("invalid --pool-model %q: %v", m, err)
		}
	}
	return nil
}

// namespace returns --pool-namespace, else $NAMESPACE (GIE's chart sets
// it), else "default".
func (d *discoveryFlags) namespace() string {
	if d.poolNamespace != "" {
		return d.poolNamespace
	}
	if ns := os.Getenv("NAMESPACE"); ns != "" {
		return ns
	}
	return "default"
}

// restConfig returns the cluster's client configuration.
func (d *discoveryFlags) restConfig() (*rest.Config, error) {
	if d.kubeconfig == "" {
		if c, err := rest.InClusterConfig(); err == nil {
			return c, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = d.kubeconfig
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, usagef("invalid --kubeconfig %q: %v", d.kubeconfig, err)
	}
	return c, nil
}

// metrics, when discovery is on, gives o a registry of its own (with the
// Go runtime and process collectors, as httpgw's default) on which start
// registers GIE's pool series (k8s.PoolCollector); nil otherwise.
func (d *discoveryFlags) metrics(o *httpgw.Options) *prometheus.Registry {
	if !d.enabled() {
		return nil
	}
	return processRegistry(o)
}

// processRegistry gives o a fresh registry carrying the Go runtime's and
// the process's metrics, as httpgw's default, and returns it.
func processRegistry(o *httpgw.Options) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	o.Registerer, o.Gatherer = reg, reg
	return reg
}

// start starts discovery feeding the control plane fl (the HTTP gateway's
// or the picker's), with the configuration file at path as the base it
// merges the replicas into, re-read every reload (fl must not reload the
// file itself). It returns once discovery runs; stop ends
// it.
// When reg is not nil, GIE's pool series are registered on it.
func (d *discoveryFlags) start(path string, reload time.Duration, fl *fleet.Fleet, reg *prometheus.Registry, logger *slog.Logger) (disc *k8s.Discovery, stop func(), err error) {
	rc, err := d.restConfig()
	if err != nil {
		return nil, nil, err
	}
	var models []string
	if len(d.poolModels) > 0 {
		models = d.poolModels
	}
	disc, err = k8s.New(k8s.Options{Config: rc, Namespace: d.namespace(), Pool: d.poolName, PoolGroup: d.poolGroup,
		Service: d.service, ServicePort: d.servicePort, Selector: d.selector, TargetPorts: d.ports, Models: models,
		Template: config.Model{Mode: gateway.ModeCacheAware},
		Base:     func() (*config.File, error) { return config.Load(path) },
		Logger:   logger}, fl)
	if err != nil {
		return nil, nil, usagef("%v", err)
	}
	if reg != nil {
		name := d.sourceName()
		if err := reg.Register(k8s.NewPoolCollector(name, fl.Stats, disc, d.staleness)); err != nil {
			return nil, nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := disc.Run(ctx); err != nil && ctx.Err() == nil {
			logger.Error("k8s: discovery stopped", "err", err)
		}
	}()
	go func() {
		t := time.NewTicker(reload)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				disc.Resync() // applies only when the file changed the result
			}
		}
	}()
	return disc, func() { cancel(); <-done }, nil
}
