package mutex

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"
)

// SemaphoreQuorum returns how many of nodes independent masters must grant
// an acquisition of a semaphore of size permits so that the permits held
// never exceed size: floor(nodes*size/(size+1)) + 1. Each node grants at
// most size, so holders of weight W on Q nodes each need W*Q <= nodes*size,
// and W stays at most size only when (size+1)*Q > nodes*size: a majority
// for size 1, every node from size nodes-1 on. nodes and size must be at
// least 1 (ErrInvalid).
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

// semQuorum keeps a semaphore on a quorum: each node keeps it as one Redis
// does, and an acquisition holds when need nodes granted it in time.
type semQuorum struct {
	q    *quorum
	need int // SemaphoreQuorum's
}

// semTry is TryAcquire on a quorum: the acquire script on every node at
// once, granted when need nodes grant it in time (leaseLeft); otherwise
// given back on every node.
func (sq semQuorum) semTry(ctx context.Context, s *Semaphore, tok string, n int64, cfg lockConfig) (*Permit, error) {
	start := time.Now()
	args := []any{tok, n, s.size, cfg.ttl.Milliseconds(), "t", s.waitLease().Milliseconds(), s.channel}
	v := sq.q.poll(ctx, semAcquireScript, s.keys, args, readSemLease)
	if left, ok := v.leaseLeft(sq.need, start); ok && v.bad == nil {
		return s.newPermit(tok, n, cfg, start, 0, left, 0), nil
	}
	if len(v.yes) > 0 || len(v.errs) > 0 {
		s.cancel(ctx, tok) // nodes that failed may have granted it too
	}
	err := cmp.Or(v.bad, v.refusal(len(sq.q.nodes), sq.need, time.Since(start), cfg.ttl))
	if err != nil {
		return nil, opErr("semaphore", s.name, err)
	}
	return nil, ErrNoPermits
}

// readSemLease reads a node's reply to the semaphore's acquire or extend
// script, {1, now, lease end, ...} when it grants: the lease (ms) it gives,
// a refusal, or a semaphore of another size (acquire only).
func readSemLease(v *votes, reply any) error {
	r, err := semNums(reply)
	switch {
	case err != nil:
		return err
	case r[0] == semBadSize:
		v.bad = fmt.Errorf("%w: semaphore has size %d in Redis on a node", ErrInvalid, r[1])
	case r[0] == semGranted && len(r) >= 3:
		v.yes = append(v.yes, r[2]-r[1])
	default:
		v.no++
	}
	return nil
}

// semWait is Acquire on a quorum: semTry, again every jittered retry
// interval while the permits are not free. Each node keeps its own queue,
// so a quorum has no FIFO order to offer; its waiters do not queue, they
// poll.
func (sq semQuorum) semWait(ctx context.Context, s *Semaphore, n int64, cfg lockConfig) (*Permit, error) {
	for {
		p, err := sq.semTry(ctx, s, newSemToken(), n, cfg)
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

// semRelease runs the release script on every node (a cancel records tok
// on a node that has not run the acquisition yet, which then grants
// nothing; a quorum's tokens never queue, so a node answers semReleased
// or semNotHolder). It reports true when need nodes released the permits,
// false when too many no longer had them for need to, else ErrNoQuorum.
func (sq semQuorum) semRelease(ctx context.Context, s *Semaphore, tok, mode string) (bool, error) {
	v := sq.q.poll(ctx, semReleaseScript, s.keys, []any{tok, s.channel, recordTTL.Milliseconds(), mode}, readHolder(semNotHolder))
	return v.verdict(len(sq.q.nodes), sq.need, "release", "released the permits")
}

// semExtend sets the lease of p's permits on every node. It reports false
// when too many nodes no longer have them, and ErrNoQuorum when too many
// failed or the call took the new lease.
func (sq semQuorum) semExtend(ctx context.Context, p *Permit, d time.Duration) (bool, error) {
	s, start := p.s, time.Now()
	v := sq.q.poll(ctx, semExtendScript, s.keys, []any{p.token, d.Milliseconds()}, readSemLease)
	if held, err := v.verdict(len(sq.q.nodes), sq.need, "extend", "extended the permits"); !held {
		return false, err
	}
	left := time.Duration(v.nth(sq.need)) * time.Millisecond
	if err := late(start, left, d, v.errs); err != nil {
		return false, err
	}
	p.setLease(start, left)
	return true, nil
}
