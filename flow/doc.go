// Package flow holds requests that arrive past a pool's capacity and
// decides which goes next: flow control, after the Gateway API Inference
// Extension's (pkg/epp/flowcontrol in GIE v1.5.0), whose vocabulary it
// keeps.
//
// A request belongs to a flow (a fairness id: a tenant, a user tier, an
// API key) and a priority band. A Queue's decisions are these, each a
// method whose result depends only on the queue's contents, the
// arguments and the room function the caller passes:
//
//   - Push: hold a request, or refuse it (ErrFull names the bound it would
//     break; ErrSheddable for a negative priority, which is never held).
//     A full queue makes room by displacing one request: a lower band's,
//     or that of a flow holding at least two more than the newcomer's, so
//     one flow's flood cannot keep the others out. Queues sharing a
//     Budget (a front's, one queue per model) displace by the same rule
//     across all of them once the budget is full.
//   - Next: the request to dispatch now. Bands go in strict priority
//     order; within a band, flows take turns in start-time fair
//     queueing's order (RoundRobin) or the oldest head goes first
//     (GlobalStrict, GIE's default); within a flow,
//     first come first served (FCFS) or earliest deadline first (EDF). It
//     is work-conserving: it returns a request whenever one held has room,
//     so it never holds a request that could go.
//   - Expire: the requests whose deadline has passed, each to be answered.
//   - Remove: a request whose client went away.
//
// Bind is the room a front gives Next (through a Controller's bind): the
// gateway's admission rule says some replica has room, and the request is
// routed at that moment (late binding). The HTTP gateway, the picker and
// the simulator all bind with it. Limit scales that rule by a band's usage
// limit (Options.UsageLimits, GIE's UsageLimitPolicy), so that a lower
// band dispatches only while the replicas keep headroom for higher ones.
//
// Strict priority: of two held requests that both have room, the one in
// the higher band is dispatched first. A lower band's request is
// dispatched while a higher band's waits only when the higher one has no
// room (room is per request: a request bound to an adapter, or with a
// latency objective, may have none while another has).
//
// Fairness bound (RoundRobin, each request costing 1): while every head
// has room, over any run of dispatches during which two flows of a band
// stay backlogged, their dispatch counts differ by at most one; a flow
// that becomes backlogged goes before every flow that has had its turn in
// the current round; a flow that sends one request at a time, at once
// after each is dispatched, gets no more than one turn a round
// (Queue.Next).
// Bounds: bytes and requests per band and in total, and flows per band
// (ids past MaxFlows share one overflow flow, so a client cannot grow the
// table). Every held request has a deadline.
//
// Rate is the other admission decision a front makes per client rather
// than per pool: Rate.Admit, the generic cell rate algorithm, admits a
// client's request or says how long until one would be, from one time
// kept per client; a RateLimiter keeps those times for a bounded number
// of clients (the HTTP gateway's --rate-limit).
//
// A Queue is safe for concurrent use; its methods take one mutex. The room
// function runs under it and must not block or call the Queue. The zero
// cost of flow control when off is the front's: it makes no Queue.
package flow
