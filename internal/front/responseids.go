package front

import (
	"net/netip"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// MaxResponseIDs is how many response ids a ResponseIDs remembers.
//
// Bounds (docs/gateway.md, "Responses API"): at the bound a table holds
// 13.5 MiB with one client (216 bytes an id), 16.2 MiB when each id is
// another client's (259 bytes an id, the worst case), ids of vLLM's shape (EXA_MEASURE=1 go test -run
// TestResponseIDsMemory -v ./internal/front).
const MaxResponseIDs = 1 << 16

// ResponseIDs remembers the replica of each recent response id, at most
// MaxResponseIDs of them, shared fairly between the clients that
// produced them. Safe for concurrent use; the zero value is empty. A
// front keeps one.
//
// Each id belongs to the client whose request produced it (ClientOf: its
// address) and is kept in that client's list, most recently used first:
// learned (Add) or looked up (Owner, Lookup). When the table is full, the
// id forgotten to make room is the least recently used one of the client
// holding the most ids, the adding client counted with its new id
// (evictee): a client never loses an id to another client while it
// holds fewer than that client will, so one client sending responses
// without end forgets only its own, and with n clients each keeps at
// least its MaxResponseIDs/n most recently used.
type ResponseIDs struct {
	mu sync.Mutex
	// max is the capacity; 0 means MaxResponseIDs (tests shrink it).
	max     int
	m       map[string]*pinned
	clients map[uint64]*pinClient
	// byCount[n] are the clients holding n ids (n ≥ 1); top is the
	// largest n with a client, 0 when the table is empty.
	byCount [][]*pinClient
	top     int
}

// pinned is one remembered response id, in its client's list.
type pinned struct {
	id, model, replica string
	c                  *pinClient
	prev, next         *pinned // towards the client's most and least recently used
}

// pinClient is one client's ids, most recently used first.
type pinClient struct {
	key        uint64
	n          int // ids held
	pos        int // index in byCount[n]
	head, tail *pinned
}

// ClientOf is the client a ResponseIDs counts an id against, from the
// address of the request that produced it (a host, with or without a
// port): the IP address, an IPv6 one reduced to its /64 network (one
// host's usual share); "" (one client for all) when addr holds none.
func ClientOf(addr string) string {
	addr = strings.TrimSpace(addr)
	ap, err := netip.ParseAddrPort(addr)
	ip := ap.Addr()
	if err != nil {
		if ip, err = netip.ParseAddr(strings.Trim(addr, "[]")); err != nil {
			return ""
		}
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.WithZone("").Prefix(64)
		return p.String()
	}
	return ip.String()
}

// evictee returns the index, in counts (the ids each client holds), of
// the client whose least recently used id a full table forgets to make
// room for an id of client adder: adder itself when it holds at least as
// many ids as any other client, else the first client holding the most.
// counts holds at least one positive count.
func evictee(adder int, counts []int) int {
	top := 0
	for i, n := range counts {
		if n > counts[top] {
			top = i
		}
	}
	if counts[adder] > 0 && counts[adder] >= counts[top] {
		return adder
	}
	return top
}

// capacity is r.max or its default.
func (r *ResponseIDs) capacity() int {
	if r.max > 0 {
		return r.max
	}
	return MaxResponseIDs
}

// Add remembers that replica of model produced response id, for client
// (ClientOf of the request's address). An id already known takes the
// model and replica given and is refreshed as if looked up; it stays its
// first client's.
func (r *ResponseIDs) Add(id, model, replica, client string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]*pinned)
		r.clients = make(map[uint64]*pinClient)
		r.byCount = make([][]*pinClient, 1, 16)
	}
	if p, ok := r.m[id]; ok {
		p.model, p.replica = model, replica
		r.use(p)
		return
	}
	key := xxhash.Sum64String(client)
	c := r.clients[key]
	if len(r.m) >= r.capacity() {
		// evictee, in O(1): the adder when it holds top ids, else a
		// client holding top.
		v := c
		if c == nil || c.n < r.top {
			b := r.byCount[r.top]
			v = b[len(b)-1]
		}
		r.remove(v.tail)
		if c != nil && c.n == 0 {
			c = nil // removed with its last id
		}
	}
	if c == nil {
		c = &pinClient{key: key}
		r.clients[key] = c
	}
	p := &pinned{id: id, model: model, replica: replica, c: c}
	r.m[id] = p
	r.setCount(c, c.n+1)
	r.push(p)
}

// Owner returns the replica of model that produced response id, if known,
// and marks the id used.
func (r *ResponseIDs) Owner(id, model string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.m[id]
	if !ok || p.model != model {
		return "", false
	}
	r.use(p)
	return p.replica, true
}

// Lookup returns the model and replica that produced response id, if
// known, and marks the id used.
func (r *ResponseIDs) Lookup(id string) (model, replica string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.m[id]
	if !ok {
		return "", "", false
	}
	r.use(p)
	return p.model, p.replica, true
}

// Forget removes response id (its engine deleted it).
func (r *ResponseIDs) Forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.m[id]; ok {
		r.remove(p)
	}
}

// Len returns how many ids r holds.
func (r *ResponseIDs) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}

// use moves p to the front of its client's list.
func (r *ResponseIDs) use(p *pinned) {
	if p.c.head == p {
		return
	}
	r.unlink(p)
	r.push(p)
}

// push puts p at the front of its client's list.
func (r *ResponseIDs) push(p *pinned) {
	c := p.c
	p.prev, p.next = nil, c.head
	if c.head != nil {
		c.head.prev = p
	}
	c.head = p
	if c.tail == nil {
		c.tail = p
	}
}

// unlink takes p out of its client's list.
func (r *ResponseIDs) unlink(p *pinned) {
	c := p.c
	if p.prev != nil {
		p.prev.next = p.next
	} else {
		c.head = p.next
	}
	if p.next != nil {
		p.next.prev = p.prev
	} else {
		c.tail = p.prev
	}
	p.prev, p.next = nil, nil
}

// remove forgets p, and its client once it holds no id.
func (r *ResponseIDs) remove(p *pinned) {
	r.unlink(p)
	delete(r.m, p.id)
	c := p.c
	r.setCount(c, c.n-1)
	if c.n == 0 {
		delete(r.clients, c.key)
	}
}

// setCount moves client c from byCount[c.n] to byCount[n], keeping top.
func (r *ResponseIDs) setCount(c *pinClient, n int) {
	if c.n > 0 {
		b := r.byCount[c.n]
		last := b[len(b)-1]
		b[c.pos], last.pos = last, c.pos
		b[len(b)-1] = nil
		r.byCount[c.n] = b[:len(b)-1]
	}
	c.n = n
	if n > 0 {
		for len(r.byCount) <= n {
			r.byCount = append(r.byCount, nil)
		}
		c.pos = len(r.byCount[n])
		r.byCount[n] = append(r.byCount[n], c)
	}
	if n > r.top {
		r.top = n
	}
	for r.top > 0 && len(r.byCount[r.top]) == 0 {
		r.top--
	}
}
