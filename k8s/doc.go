// Package k8s discovers a model's replicas in Kubernetes and feeds them to
// the control plane that the HTTP gateway and the endpoint picker share
// ([fleet.Fleet.Apply]), so pods that come and go join and leave the
// replica table without a restart.
//
// Two sources are supported, one per [Discovery]:
//
//   - an InferencePool (Gateway API Inference Extension,
//     inference.networking.k8s.io/v1): the pool's spec.selector picks Pods
//     in its namespace, and every ready Pod (condition Ready true, not being
//     deleted, with a pod IP) becomes one replica per spec.targetPorts
//     entry (those its annotation inference.networking.k8s.io/active-ports
//     lists, when it has one), as GIE's endpoint picker v1.5.0 does
//     (pkg/epp/datastore/datastore.go: one endpoint per pod and target
//     port, named POD-rank-I; here a pool of one port names it POD);
//   - a Service's EndpointSlices (label kubernetes.io/service-name): every
//     ready endpoint becomes a replica on the slice's port.
//
// The replicas are merged into a base configuration (the routing
// configuration file) as the replicas of the models the discovery serves,
// and the result is applied. Updates are coalesced: a burst of pod events
// makes one Apply after [Options.Debounce]. Nothing is applied before the
// watch caches have synced, and a failed read of the base configuration
// keeps the running configuration: discovery never applies an empty list
// because something failed, only when the pool has no ready pod.
//
// WatchObjectives feeds flow control's objectives (name to priority) from
// GIE's InferenceObjectives of the same pool, at most MaxObjectives.
//
// The root package gateway does not import this package; only the CLI
// (exa serve gateway / picker) and embedders that want discovery do.
package k8s
