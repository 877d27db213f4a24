package mutex

import (
	"time"
)

// ended reports whether the Permit has ended (released or lost, as it is
// once its lease has passed).
func (p *Permit) ended() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.endedLocked() != nil
}

// endedLocked returns the Permit's cause once it has ended, else nil; it
// ends the Permit first if its lease has passed on the client's clock,
// without waiting for the deadline timer (which fires late on a loaded
// machine, and runs only once someone watches), so that every answer is
// the one of the moment it is asked.
func (p *Permit) endedLocked() error {
	if p.phase < released && !time.Now().Before(p.deadline) {
		p.endLocked(lost)
	}
	return p.causeLocked()
}

// watchedLocked is endedLocked for a watcher (Done, Context): while the
// Permit is open, the deadline timer runs, to end it when the lease passes.
func (p *Permit) watchedLocked() error {
	err := p.endedLocked()
	if err == nil {
		p.watchLocked()
	}
	return err
}

// end ends the Permit in phase ph (released or lost), once.
func (p *Permit) end(ph phase) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endLocked(ph)
}

func (p *Permit) endLocked(ph phase) {
	if p.phase >= released {
		return
	}
	p.lifeSignal.endLocked(ph)
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.renew != nil {
		p.renew.stopLocked()
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

// watchLocked starts the deadline timer, once.
func (p *Permit) watchLocked() {
	if p.phase >= released || p.timer != nil {
		return
	}
	p.timer = time.AfterFunc(time.Until(p.deadline), p.checkDeadline)
}

// armLocked moves the deadline timer to a new deadline.
func (p *Permit) armLocked() {
	if p.phase < released && p.timer != nil {
		p.timer.Reset(time.Until(p.deadline))
	}
}

func (p *Permit) checkDeadline() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase >= released {
		return
	}
	if left := time.Until(p.deadline); left > 0 {
		p.timer.Reset(left)
		return
	}
	// A Release under way does not stop the signal: its script may find the
	// permits expired and given to another holder.
	p.endLocked(lost)
}

// startRenew starts renewing the lease every lease/3 (AutoRenew).
func (p *Permit) startRenew() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase >= released || p.renew != nil {
		return
	}
	r := &renewal{stop: make(chan struct{}), done: make(chan struct{})}
	p.renew = r
	p.watchLocked()
	go renewLoop(p, r, p.lease)
}

// stopRenew stops the renewal and waits until none runs.
func (p *Permit) stopRenew() {
	p.mu.Lock()
	r := p.renew
	if r != nil {
		r.stopLocked()
	}
	p.mu.Unlock()
	if r != nil {
		<-r.done
	}
}
