package mutex

import (
	"context"
	"time"
)

// A Permit is one acquisition of a Semaphore's permits, returned by
// TryAcquire and Acquire. Like a Lock it is a state machine (held,
// releasing, released, lost): its methods are safe for concurrent use, and
// of racing Releases exactly one returns nil, the others ErrNotHeld. A nil
// *Permit is safe to Release (ErrNotHeld).
type Permit struct {
	s     *Semaphore
	token string
	n     int64
	fence int64

	life       // the lease's; mu guards the Permit
	lifeSignal // its phase, Done's channel and Context's contexts
}

func (p *Permit) endLocked(ph phase) {
	if p.finishLocked() {
		p.lifeSignal.endLocked(ph)
	}
}

// lose ends the Permit as lost, unless a Release is under way: its reply
// says how the Permit ended.
func (p *Permit) lose() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase == held {
		p.endLocked(lost)
	}
}

// N returns the number of permits held (0 for a nil Permit).
func (p *Permit) N() int64 {
	if p == nil {
		return 0
	}
	return p.n
}

// Fence returns the fencing number of this acquisition: greater than the
// numbers of all earlier acquisitions of the semaphore (while its keys
// live, and after, unless the server's clock moved back). It is 0 on a
// quorum Locker: each node numbers its own grants, and a holder's numbers on
// its nodes are not ordered with another's.
func (p *Permit) Fence() int64 {
	if p == nil {
		return 0
	}
	return p.fence
}

// Token returns the random token (128 bits, hex) of this acquisition.
func (p *Permit) Token() string {
	if p == nil {
		return ""
	}
	return p.token
}

// Release gives the permits back, and grants them to the waiters at the head
// of the queue that now fit, in the same script. It returns ErrNotHeld when
// the Permit was released already, is being released by another call, or
// was lost (its lease ended). A cancellation of ctx does not stop it; its
// deadline bounds it (2 s when ctx has none or has ended). After a Redis
// error the Permit stays held and Release can be called again: a release
// whose reply was lost answers the retry as its first run, within 10 s. On
// a quorum it runs on every node: nil when Q nodes released the permits,
// ErrNotHeld when too many no longer had them, else an error matching
// ErrNoQuorum, after which the Permit stays held as after a Redis error.
func (p *Permit) Release(ctx context.Context) error {
	if ctx == nil {
		return ErrNilContext
	}
	if p == nil {
		return ErrNotHeld
	}
	p.mu.Lock()
	if p.phase != held {
		p.mu.Unlock()
		return ErrNotHeld
	}
	p.phase = releasing
	p.mu.Unlock()
	p.stopRenew()
	ctx, cancel := detach(ctx)
	defer cancel()
	s := p.s
	ok, err := s.dep.semRelease(ctx, s, p.token, "")
	if err != nil {
		p.abortRelease(&p.lifeSignal) // to be released again; renewal does not restart
		return opErr("release semaphore", s.name, err)
	}
	if !ok {
		p.end(p, lost)
		return ErrNotHeld
	}
	p.end(p, released)
	return nil
}

func (single) semRelease(ctx context.Context, s *Semaphore, tok, mode string) (bool, error) {
	reply, err := s.l.run(ctx, semReleaseScript, s.keys, []any{tok, s.channel, recordTTL.Milliseconds(), mode}, nil)
	if err != nil {
		return false, err
	}
	n, err := integer(reply)
	return n == semReleased, err
}

// Extend sets the lease of the permits to d from now (1 ms to MaxTTL). It
// returns ErrNotHeld when the Permit has ended or Redis no longer has it.
// On a quorum it needs Q nodes, as an acquisition does (else ErrNoQuorum,
// or ErrNotHeld when too many nodes no longer have the permits); with
// WithReplicaAck, the replicas' acknowledgement (else ErrNotReplicated: the
// Permit counts on its old lease).
func (p *Permit) Extend(ctx context.Context, d time.Duration) error {
	if ctx == nil {
		return ErrNilContext
	}
	if err := checkDuration("lease", d); err != nil {
		return err
	}
	if _, ok := p.Deadline(); !ok {
		return ErrNotHeld // a lease that has passed is so too
	}
	held, err := p.s.dep.semExtend(ctx, p, d)
	switch {
	case err != nil:
		return opErr("extend semaphore", p.s.name, err)
	case !held:
		p.lose()
		return ErrNotHeld
	}
	return nil
}

// semExtend runs semaphore_extend.lua, and WAIT in the same round trip
// (WithReplicaAck), then records the new lease.
func (single) semExtend(ctx context.Context, p *Permit, d time.Duration) (bool, error) {
	s, start := p.s, time.Now()
	args := []any{p.token, d.Milliseconds()}
	reply, short, err := s.l.runWithAck(ctx, semExtendScript, s.keys, args, false, false, nil)
	if err != nil {
		return false, err
	}
	r, err := semNums(reply)
	switch {
	case err != nil || r[0] != 1 || len(r) < 3:
		return false, err
	case short != nil:
		return true, short // extended on the master alone
	}
	p.setLease(start, time.Duration(r[2]-r[1])*time.Millisecond)
	return true, nil
}

// renewOnce is the Permit's lifeOwner step for WithAutoRenew.
func (p *Permit) renewOnce(ctx context.Context, lease time.Duration) (bool, error) {
	return p.s.dep.semExtend(ctx, p, lease)
}

// Done returns a channel that is closed when the Permit ends: after Release
// (before it returns), or when it is lost (its lease passed on the client's
// clock, with a drift margin, without an Extend; or Redis reported it
// gone). A call made once the lease has passed returns a closed channel. A
// channel taken earlier is closed by a timer at the end of the lease, which
// in a process paused past the lease runs only after the process resumes:
// a holder about to act checks Deadline, or calls Done again.
func (p *Permit) Done() <-chan struct{} {
	if p == nil {
		return closedChan
	}
	return p.done(p, &p.lifeSignal)
}

// Deadline returns the time until which the permits are surely held, on the
// client's clock: the end of the lease Redis granted (or set by the last
// Extend or renewal), less the drift margin. ok is false once the Permit has
// ended, as it has when that time has passed. Check it right before an
// action that must run holding the permits.
func (p *Permit) Deadline() (deadline time.Time, ok bool) {
	if p == nil {
		return time.Time{}, false
	}
	return p.leaseDeadline(p, &p.lifeSignal)
}

// Context returns a context derived from parent that is cancelled when the
// Permit ends (before the Release that ends it returns, at once if it has
// ended): with cause ErrLockLost when it was lost, ErrNotHeld after Release
// (read it with context.Cause).
func (p *Permit) Context(parent context.Context) context.Context {
	if p == nil {
		return new(lifeSignal).deriveLocked(nil, parent, ErrNotHeld) // ended: uses neither the signal nor a mutex
	}
	return p.context(p, &p.lifeSignal, parent)
}
