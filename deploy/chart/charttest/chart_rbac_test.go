package charttest

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// access is one request the service account may or may not make.
type access struct{ verb, group, resource string }

// TestChartRoleGrantsWhatTheCodeUses: on a real API server (RBAC
// authorization), the chart's service account may make exactly the
// requests the process makes: list and watch (its watch caches; get as
// GIE's chart grants) on pods and InferencePools, and on
// InferenceObjectives (--flow-control), or on a Service's EndpointSlices;
// with several pickers, get, create and update on Leases (client-go's
// LeaseLock, releasing included) and nothing more on them.
func TestChartRoleGrantsWhatTheCodeUses(t *testing.T) {
	c := startAPIServer(t)
	ctx := context.Background()
	watch := func(group, resource string) []access {
		return []access{{"get", group, resource}, {"list", group, resource}, {"watch", group, resource}}
	}
	pool := append(append(watch("", "pods"), watch("inference.networking.k8s.io", "inferencepools")...),
		watch("inference.networking.x-k8s.io", "inferenceobjectives")...)
	lease := []access{{"get", "coordination.k8s.io", "leases"}, {"create", "coordination.k8s.io", "leases"}, {"update", "coordination.k8s.io", "leases"}}
	for i, tt := range []struct {
		set  string
		want []access
	}{
		{"picker", pool},
		{"picker-ha", append(append([]access(nil), pool...), lease...)},
		{"gateway", watch("discovery.k8s.io", "endpointslices")},
	} {
		ns := fmt.Sprintf("rbac-%d", i)
		sa := "exa-" + modeOf(values[tt.set])
		objs := objects(t, renderAs(t, values[tt.set], "exa", ns))
		require.NoError(t, c.Create(ctx, namespace(ns)))
		for _, o := range objs {
			switch o.GetKind() {
			case "ServiceAccount", "Role", "RoleBinding":
				require.NoError(t, c.Create(ctx, o), "%s: %s %s", tt.set, o.GetKind(), o.GetName())
			}
		}
		wanted := map[access]bool{}
		for _, a := range tt.want {
			wanted[a] = true
		}
		for _, r := range []struct{ group, resource string }{{"", "pods"}, {"inference.networking.k8s.io", "inferencepools"},
			{"inference.networking.x-k8s.io", "inferenceobjectives"}, {"discovery.k8s.io", "endpointslices"},
			{"coordination.k8s.io", "leases"}, {"", "secrets"}, {"", "events"}} {
			for _, verb := range []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"} {
				a := access{verb, r.group, r.resource}
				rev := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
					User:               "system:serviceaccount:" + ns + ":" + sa,
					Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns},
					ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: r.group, Resource: r.resource}}}
				require.NoError(t, c.Create(ctx, rev))
				require.Equal(t, wanted[a], rev.Status.Allowed, "%s: %s %s.%s", tt.set, verb, r.resource, r.group)
			}
		}
	}
}

func namespace(name string) client.Object {
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name}}}
}
