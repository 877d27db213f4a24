package mutex

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// SemaphoreQuorum returns how many of nodes independent masters must grant
// an acquisition of a semaphore of size permits so that the permits held
// never exceed size: floor(nodes*size/(size+1)) + 1.
//
// Each node grants at most size permits (the sum of n over its holders). If
// holders of total weight W each hold their permits on Q nodes, they occupy
// W*Q node-permits of the nodes*size there are, so W <= nodes*size/Q; W can
// never reach size+1 exactly when (size+1)*Q > nodes*size. A smaller Q lets
// size+1 holders in: three nodes and size 2 with a majority (Q = 2) admit
// three holders, on nodes {1,2}, {2,3} and {3,1}. The quorum is a majority
// for size 1 and grows with size up to all the nodes (from size nodes-1 on),
// and a semaphore on the quorum survives nodes-Q nodes down: none when Q is
// nodes.
//
// nodes must be at least 1 and size at least 1 (ErrInvalid).
func SemaphoreQuorum(nodes int, size int64) (int, error) {
	if nodes < 1 || size < 1 {
		return 0, fmt.Errorf("%w: quorum of a semaphore of %d on %d nodes", ErrInvalid, size, nodes)
	}
	if size >= int64(nodes) {
		return nodes, nil
	}
	// floor(M*N/(N+1)) = M - ceil(M/(N+1)): no product to overflow.
	m, n1 := int64(nodes), size+1
	return int(m - (m+n1-1)/n1 + 1), nil
}

// semVotes are the nodes' answers to one acquisition of a quorum
// semaphore: the lease (ms) each granting node gave, the errors, and a
// node's report of another size.
type semVotes struct {
	lefts []int64
	errs  []error
	bad   error
}

// count adds one node's reply to the acquire script.
func (v *semVotes) count(nr nodeReply) {
	if nr.err != nil {
		v.errs = append(v.errs, nr.err)
		return
	}
	r, err := semNums(nr.reply)
	switch {
	case err != nil:
		v.errs = append(v.errs, err)
	case r[0] == semBadSize:
		v.bad = fmt.Errorf("%w: semaphore has size %d in Redis on a node", ErrInvalid, r[1])
	case r[0] == semGranted && len(r) >= 4:
		v.lefts = append(v.lefts, r[2]-r[1])
	}
}

// atLeast returns the lease that need of the leases still have (the
// need-th longest), or -1 when fewer than need nodes gave one.
func atLeast(lefts []int64, need int) int64 {
	if len(lefts) < need {
		return -1
	}
	lefts = slices.Clone(lefts)
	slices.Sort(lefts)
	return lefts[len(lefts)-need]
}

// tryQuorum is TryAcquire on a quorum Locker: the acquire script on every
// node at once, granted when need nodes grant it and the lease they all
// still have outlasts the time the call took (less the drift margin);
// otherwise given back on every node.
func (s *Semaphore) tryQuorum(ctx context.Context, tok string, n int64, cfg lockConfig) (*Permit, error) {
	q := s.l.q
	start := time.Now()
	args := []any{tok, n, s.size, cfg.ttl.Milliseconds(), "t", s.waitLease().Milliseconds(), s.channel}
	var v semVotes
	for _, nr := range q.fan(ctx, semAcquireScript, s.keys, args) {
		v.count(nr)
	}
	left := atLeast(v.lefts, s.need)
	if left > 0 && time.Now().Before(serverDeadline(start, 0, left)) && v.bad == nil {
		return s.newPermit(tok, n, cfg, start, 0, left, 0), nil
	}
	if len(v.lefts) > 0 || len(v.errs) > 0 {
		s.cancel(ctx, tok) // nodes that failed may have granted it too
	}
	switch {
	case v.bad != nil:
		return nil, fmt.Errorf("mutex: semaphore %q: %w", s.name, v.bad)
	case len(v.errs) > len(q.nodes)-s.need:
		return nil, noQuorum(fmt.Sprintf("semaphore %q: %d of %d nodes failed, %d must grant", s.name, len(v.errs), len(q.nodes), s.need), v.errs)
	case len(v.lefts) >= s.need:
		return nil, noQuorum(fmt.Sprintf("semaphore %q: acquiring took %v of a %v lease", s.name, time.Since(start), cfg.ttl), v.errs)
	}
	return nil, ErrNoPermits
}

// acquireQuorum is Acquire on a quorum Locker: tryQuorum, again every
// jittered retry interval while the permits are not free. Each node keeps
// its own queue, so a quorum has no FIFO order to offer; its waiters do not
// queue, they poll.
func (s *Semaphore) acquireQuorum(ctx context.Context, n int64, cfg lockConfig) (*Permit, error) {
	for {
		p, err := s.tryQuorum(ctx, newSemToken(), n, cfg)
		if !errors.Is(err, ErrNoPermits) {
			if err != nil && ctx.Err() != nil {
				err = errors.Join(ErrNotObtained, ctx.Err(), err)
			}
			return p, err
		}
		t := time.NewTimer(s.l.nextWait(-1))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, errors.Join(ErrNotObtained, ctx.Err())
		case <-t.C:
		}
	}
}

// cancelQuorum runs the release script in its cancel mode for tok on every
// node: the permits a node granted come back, and a node that has not run
// the acquisition yet records tok, so it grants nothing when it does.
func (s *Semaphore) cancelQuorum(ctx context.Context, tok string) {
	s.l.q.fan(ctx, semReleaseScript, s.keys, []any{tok, s.channel, semRecordTTL.Milliseconds(), "c"})
}

// releaseQuorum releases tok's permits on every node. It answers
// semReleased when need nodes released them, semNotHolder when too many
// nodes no longer had them for need to, and ErrNoQuorum otherwise.
func (s *Semaphore) releaseQuorum(ctx context.Context, tok string) (int64, error) {
	q := s.l.q
	var released, lost int
	var errs []error
	for _, nr := range q.fan(ctx, semReleaseScript, s.keys, []any{tok, s.channel, semRecordTTL.Milliseconds(), ""}) {
		res, err := nr.reply, nr.err
		var v int64
		if err == nil {
			v, err = integer(res)
		}
		switch {
		case err != nil:
			errs = append(errs, err)
		case v == semReleased:
			released++
		default:
			lost++
		}
	}
	switch {
	case released >= s.need:
		return semReleased, nil
	case lost > len(q.nodes)-s.need:
		return semNotHolder, nil
	}
	return 0, noQuorum(fmt.Sprintf("%d of %d nodes released the permits, %d failed, %d must", released, len(q.nodes), len(errs), s.need), errs)
}

// extendQuorum sets the lease of p's permits on every node. It reports
// false when too many nodes no longer have them, and ErrNoQuorum when too
// many failed or the call took the new lease.
func (p *Permit) extendQuorum(ctx context.Context, d time.Duration) (bool, error) {
	s, q := p.s, p.s.l.q
	start := time.Now()
	var lefts []int64
	var lost int
	var errs []error
	for _, nr := range q.fan(ctx, semExtendScript, s.keys, []any{p.token, d.Milliseconds()}) {
		r, err := nr.reply, nr.err
		var v []int64
		if err == nil {
			v, err = semNums(r)
		}
		switch {
		case err != nil:
			errs = append(errs, err)
		case v[0] == 1 && len(v) >= 3:
			lefts = append(lefts, v[2]-v[1])
		default:
			lost++
		}
	}
	if left := atLeast(lefts, s.need); left > 0 && time.Now().Before(serverDeadline(start, 0, left)) {
		p.setDeadline(serverDeadline(start, 0, left))
		return true, nil
	}
	if lost > len(q.nodes)-s.need {
		return false, nil
	}
	return false, noQuorum(fmt.Sprintf("%d of %d nodes extended the permits, %d failed, %d must, in %v of a %v lease", len(lefts), len(q.nodes), len(errs), s.need, time.Since(start), d), errs)
}
