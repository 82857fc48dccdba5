package k8s

import (
	"context"
	"errors"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// cuttable is a transport that fails every request once cut, as a
// network partition between a picker and the API server does.
type cuttable struct {
	rt  http.RoundTripper
	cut atomic.Bool
}

func (c *cuttable) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.cut.Load() {
		return nil, errors.New("cut")
	}
	return c.rt.RoundTrip(r)
}

// candidate is a running Leader.
type candidate struct {
	l    *Leader
	net  *cuttable
	stop context.CancelFunc
	done chan struct{}
}

func startCandidate(t *testing.T, cfg *rest.Config, ns, id string, d [3]time.Duration) *candidate {
	t.Helper()
	c := &candidate{net: &cuttable{}, done: make(chan struct{})}
	cc := rest.CopyConfig(cfg)
	cc.Wrap(func(rt http.RoundTripper) http.RoundTripper { c.net.rt = rt; return c.net })
	var err error
	c.l, err = NewLeader(LeaderOptions{Config: cc, Namespace: ns, Name: LeaseName(ns, "pool"), Identity: id,
		LeaseDuration: d[0], RenewDeadline: d[1], RetryPeriod: d[2]})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	go func() { defer close(c.done); _ = c.l.Run(ctx) }()
	t.Cleanup(func() { stop(); <-c.done })
	return c
}

// await polls (every 5 ms, up to limit) until cond holds; it fails the
// test if two candidates ever lead at once, and returns the time taken.
func await(t *testing.T, limit time.Duration, cands []*candidate, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		n := 0
		for _, c := range cands {
			if c.l.Leading() {
				n++
			}
		}
		require.LessOrEqual(t, n, 1, "two candidates lead at once")
		require.Less(t, time.Since(start), limit, "condition not met")
		<-tick.C
	}
	return time.Since(start)
}

// Two candidates on the real API server: one leads (and the Lease names
// it), the other follows. When the leader stops, it releases the Lease
// and the follower takes over within the lease duration; when the leader
// is cut off from the API server (a crash, as far as the follower can
// tell), it steps down after its renew deadline and the follower takes
// over once the lease has expired: within lease duration + 2.2 retry
// periods of the last renewal. Never do both lead at once. The lease
// settings are short here (4 s, 3 s, 0.5 s); EXA_MEASURE=1 uses the
// defaults (15 s, 10 s, 2 s, GIE's). The takeover times are logged.
func TestLeaderElection(t *testing.T) {
	cfg, c := apiServer(t)
	ns := newNamespace(t, c)
	d := [3]time.Duration{4 * time.Second, 3 * time.Second, 500 * time.Millisecond}
	if os.Getenv("EXA_MEASURE") != "" {
		d = [3]time.Duration{DefaultLeaseDuration, DefaultRenewDeadline, DefaultRetryPeriod}
	}
	t.Logf("lease duration %v, renew deadline %v, retry period %v", d[0], d[1], d[2])
	a := startCandidate(t, cfg, ns, "a", d)
	b := startCandidate(t, cfg, ns, "b", d)
	cands := []*candidate{a, b}
	elected := await(t, 2*d[0]+5*time.Second, cands, func() bool { return a.l.Leading() || b.l.Leading() })
	t.Logf("first leader elected in %v", elected.Round(time.Millisecond))
	leader, follower := a, b
	if b.l.Leading() {
		leader, follower = b, a
	}
	holder := func() string {
		var lease coordinationv1.Lease
		require.NoError(t, c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: LeaseName(ns, "pool")}, &lease))
		if lease.Spec.HolderIdentity == nil {
			return ""
		}
		return *lease.Spec.HolderIdentity
	}
	assert.Equal(t, leader.l.Identity(), holder())
	assert.False(t, follower.l.Leading())

	// Graceful stop: Run releases the Lease.
	leader.stop()
	stopped := time.Now()
	<-leader.done
	assert.False(t, leader.l.Leading())
	await(t, 2*d[0]+5*time.Second, cands, follower.l.Leading)
	took := time.Since(stopped)
	t.Logf("after the leader stopped, the follower led in %v", took.Round(time.Millisecond))
	assert.LessOrEqual(t, took, d[0], "takeover after a release within the lease duration")
	assert.Equal(t, follower.l.Identity(), holder())

	// Partition: a third candidate follows; the leader is cut off.
	third := startCandidate(t, cfg, ns, "c", d)
	cands = []*candidate{follower, third}
	await(t, 2*d[0]+5*time.Second, cands, func() bool { return third.l.Holder() == follower.l.Identity() })
	follower.net.cut.Store(true)
	cut := time.Now()
	stepDown := await(t, 2*d[0]+5*time.Second, cands, func() bool { return !follower.l.Leading() })
	took = await(t, 3*d[0]+5*time.Second, cands, third.l.Leading) + stepDown
	t.Logf("after the leader was cut off: it stepped down in %v, the other led in %v", stepDown.Round(time.Millisecond), time.Since(cut).Round(time.Millisecond))
	assert.LessOrEqual(t, stepDown, d[1]+d[2]+time.Second, "the cut-off leader steps down after its renew deadline")
	assert.LessOrEqual(t, took, d[0]+3*d[2]+time.Second, "takeover within the lease duration and a few retries")
	assert.Equal(t, third.l.Identity(), holder())
}

// NewLeader refuses missing and inconsistent options, naming them.
func TestNewLeaderRejects(t *testing.T) {
	cfg := &rest.Config{Host: "http://127.0.0.1:1"}
	for _, tt := range []struct {
		o    LeaderOptions
		want string
	}{
		{LeaderOptions{Namespace: "n", Name: "l"}, "Config is required"},
		{LeaderOptions{Config: cfg, Name: "l"}, `Lease namespace "" and name "l" are required`},
		{LeaderOptions{Config: cfg, Namespace: "n", Name: "l", LeaseDuration: time.Second}, "lease duration 1s, renew deadline 10s, retry period 2s: want lease duration > renew deadline"},
		{LeaderOptions{Config: cfg, Namespace: "n", Name: "l", RetryPeriod: 9 * time.Second}, "retry period 9s"},
	} {
		_, err := NewLeader(tt.o)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tt.want)
	}
	l, err := NewLeader(LeaderOptions{Config: cfg, Namespace: "n", Name: "l"})
	require.NoError(t, err)
	assert.False(t, l.Leading())
	assert.Regexp(t, `^.+_[0-9a-f]{16}$`, l.Identity())
	assert.Equal(t, "epp-llm-pool.gateway-api-inference-extension.sigs.k8s.io", LeaseName("llm", "pool"))
}

// TestLeaderLateTermGoroutine: client-go runs OnStartedLeading in a
// goroutine of its own, which may run late; a term's goroutine that
// wakes only after the next term began must not end the new term (the
// Lease held, Leading false: no replica ready) nor report it.
func TestLeaderLateTermGoroutine(t *testing.T) {
	var changes []bool
	l := &Leader{opts: LeaderOptions{Logger: quiet(), OnChange: func(leading bool) { changes = append(changes, leading) }}}
	term1, end1 := context.WithCancel(context.Background())
	term2, end2 := context.WithCancel(context.Background())
	defer end2()
	// Term 1 ended (lost) before its goroutine ran; client-go called
	// OnStoppedLeading, then the candidate won term 2.
	end1()
	l.stopped()
	l.set(term2, true)
	// Term 1's goroutine runs now: its start is refused, and its end
	// (term1 is done) must leave term 2 alone.
	l.set(term1, true)
	l.set(term1, false)
	require.True(t, l.Leading(), "a late goroutine of an ended term ended the current one")
	require.Equal(t, []bool{true}, changes)
	// Term 2 ends: its own goroutine and OnStoppedLeading end it once.
	end2()
	l.set(term2, false)
	l.stopped()
	require.False(t, l.Leading())
	require.Equal(t, []bool{true, false}, changes)
}

// TestLeaderRequestTimeout: as controller-runtime's leader election
// client (pkg/leaderelection, max(RenewDeadline/2, 1s)), each request is
// bounded by half the renew deadline, so that one hung renewal leaves
// time to retry before the leader gives up its term.
func TestLeaderRequestTimeout(t *testing.T) {
	cfg := &rest.Config{Host: "http://127.0.0.1:1"}
	for _, tt := range []struct{ lease, renew, retry, want time.Duration }{
		{0, 0, 0, 5 * time.Second}, // the defaults: 15s, 10s, 2s
		{4 * time.Second, 3 * time.Second, 500 * time.Millisecond, 1500 * time.Millisecond},
		{3 * time.Second, 1500 * time.Millisecond, time.Second, time.Second},
	} {
		l, err := NewLeader(LeaderOptions{Config: cfg, Namespace: "n", Name: "l", Logger: quiet(),
			LeaseDuration: tt.lease, RenewDeadline: tt.renew, RetryPeriod: tt.retry})
		require.NoError(t, err)
		rc := l.lock.Client.(*coordclient.CoordinationV1Client).RESTClient().(*rest.RESTClient)
		assert.Equal(t, tt.want, rc.Client.Timeout, "renew deadline %v", tt.renew)
	}
}
