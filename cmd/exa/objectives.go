package main

import (
	"context"
	"errors"
	"log/slog"
	"maps"

	"github.com/examlops/gateway/k8s"
)

// watchObjectives, with --flow-control and --pool-name, watches the pool's
// InferenceObjectives (k8s.WatchObjectives) and calls set with them merged
// with --objective's on each change; --objective wins for a name in both,
// so an operator's command line pins what a cluster user cannot change.
// Otherwise it does nothing. A cluster without GIE's InferenceObjective
// CRD is logged and leaves --objective's. stop ends the watch.
func (d *discoveryFlags) watchObjectives(fl flowFlags, set func(map[string]int), logger *slog.Logger) (stop func(), err error) {
	if !fl.on || d.poolName == "" {
		return func() {}, nil
	}
	fo, err := fl.options()
	if err != nil {
		return nil, err
	}
	rc, err := d.restConfig()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := k8s.WatchObjectives(ctx, k8s.ObjectiveOptions{Config: rc, Namespace: d.namespace(), Pool: d.poolName, Logger: logger},
			func(m map[string]int) { set(mergeObjectives(m, fo.Objectives)) })
		switch {
		case errors.Is(err, k8s.ErrNoObjectiveKind):
			logger.Warn("k8s: no InferenceObjectives on this cluster; objectives from --objective only", "err", err)
		case err != nil && ctx.Err() == nil:
			logger.Error("k8s: the InferenceObjective watch stopped; keeping the last objectives", "err", err)
		}
	}()
	return func() { cancel(); <-done }, nil
}

// mergeObjectives returns the cluster's objectives with flags' over them.
func mergeObjectives(cluster, flags map[string]int) map[string]int {
	m := make(map[string]int, len(cluster)+len(flags))
	maps.Copy(m, cluster)
	maps.Copy(m, flags)
	return m
}
