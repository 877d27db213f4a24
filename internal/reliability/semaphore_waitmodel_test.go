package reliability

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"
)

// The model of the waiting path's linearizability check
// (TestSemaphoreWaitLinearizable): a semaphore with holders and a FIFO
// queue, on which a waiting Acquire is two operations, its enqueue and the
// observation that it holds its permits (or, cancelled, its enqueue and
// its cancel).

// semWaitKind is the kind of one operation of the model.
type semWaitKind int

const (
	// swTry is TryAcquire: granted if and only if nobody waits and the
	// permits fit.
	swTry semWaitKind = iota
	// swEnqueue is an Acquire's first poll: it joins the queue's tail (and
	// is granted at once if the queue was empty and its permits fit).
	swEnqueue
	// swGranted is an Acquire that returned a Permit: by then it holds.
	swGranted
	// swCancel is an Acquire whose context ended: it leaves the queue, or
	// gives back the permits a release granted it meanwhile.
	swCancel
	// swRelease and swExtend succeed if and only if the permit is held.
	swRelease
	swExtend
)

var semWaitKindNames = [...]string{"TryAcquire", "Enqueue", "Granted", "Cancel", "Release", "Extend"}

// semWaitIn is one operation: its kind, the acquisition it is about and
// that acquisition's weight; for an enqueue, the place in the queue that
// Redis answered (0 when unknown: the reply was lost, or the permits were
// granted at once).
type semWaitIn struct {
	kind semWaitKind
	id   int
	n    int64
	seq  int64
}

// semEntry is an acquisition in the model's state: a holder or a waiter.
type semEntry struct {
	id int
	n  int64
}

// semState is the model's state: the holders (by id) and the queue (in
// order). Every step ends with pump, as every script of the semaphore does:
// the head waiters are granted while they fit, and the first that does not
// stops the grants (strict FIFO).
//
// The queue's order is the order in which the enqueues take effect, and
// each enqueue with a known place must come after those with smaller
// places (last is the greatest so far): so Redis's order is checked against
// real time where the calls do not overlap, and the search need not try
// every order of the enqueues that overlap.
type semState struct {
	holders []semEntry
	queue   []semEntry
	last    int64
}

// key encodes the state as a comparable string (porcupine caches states).
func (s semState) key() string {
	var b strings.Builder
	for _, list := range [][]semEntry{s.holders, s.queue} {
		for _, e := range list {
			fmt.Fprintf(&b, "%d:%d,", e.id, e.n)
		}
		b.WriteByte('|')
	}
	b.WriteString(strconv.FormatInt(s.last, 10))
	return b.String()
}

func parseSemState(key string) semState {
	var s semState
	lists := strings.Split(key, "|")
	for i, dst := range []*[]semEntry{&s.holders, &s.queue} {
		if i >= len(lists) {
			break
		}
		for e := range strings.SplitSeq(lists[i], ",") {
			id, n, ok := strings.Cut(e, ":")
			if !ok {
				continue
			}
			a, _ := strconv.Atoi(id)
			b, _ := strconv.ParseInt(n, 10, 64)
			*dst = append(*dst, semEntry{a, b})
		}
	}
	if len(lists) > 2 {
		s.last, _ = strconv.ParseInt(lists[2], 10, 64)
	}
	return s
}

func (s semState) held() int64 {
	var sum int64
	for _, h := range s.holders {
		sum += h.n
	}
	return sum
}

func (s semState) holds(id int) bool {
	return slices.ContainsFunc(s.holders, func(e semEntry) bool { return e.id == id })
}

// drop takes id out of the holders or the queue; it reports whether it
// found it.
func (s *semState) drop(id int) bool {
	is := func(e semEntry) bool { return e.id == id }
	nh, nq := len(s.holders), len(s.queue)
	s.holders = slices.DeleteFunc(s.holders, is)
	s.queue = slices.DeleteFunc(s.queue, is)
	return len(s.holders) < nh || len(s.queue) < nq
}

func (s *semState) pump(size int64) {
	held := s.held()
	for len(s.queue) > 0 && held+s.queue[0].n <= size {
		held += s.queue[0].n
		s.holders = append(s.holders, s.queue[0])
		s.queue = s.queue[1:]
	}
	slices.SortFunc(s.holders, func(a, b semEntry) int { return a.id - b.id })
}

// semWaitModel is the model of a semaphore of size permits.
func semWaitModel(size int64) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return semState{}.key() },
		Step: func(state, input, output any) (bool, any) {
			st := parseSemState(state.(string))
			if !semWaitStep(&st, size, input.(semWaitIn), output.(bool)) {
				return false, state
			}
			st.pump(size)
			return true, st.key()
		},
		DescribeOperation: func(input, output any) string {
			in := input.(semWaitIn)
			return fmt.Sprintf("%s(%d) #%d -> %v", semWaitKindNames[in.kind], in.n, in.id, output)
		},
		DescribeState: func(state any) string { return state.(string) },
	}
}

// semWaitStep applies one operation with output ok to st; it reports
// whether the operation was legal there.
func semWaitStep(st *semState, size int64, in semWaitIn, ok bool) bool {
	switch in.kind {
	case swTry:
		fits := len(st.queue) == 0 && st.held()+in.n <= size
		if ok && fits {
			st.holders = append(st.holders, semEntry{in.id, in.n})
		}
		return ok == fits
	case swEnqueue:
		if in.seq != 0 {
			if in.seq <= st.last {
				return false
			}
			st.last = in.seq
		}
		st.queue = append(st.queue, semEntry{in.id, in.n})
		return true
	case swGranted, swExtend:
		return st.holds(in.id) == ok
	case swCancel:
		// Before its enqueue a cancel has nothing to take back: the order
		// is enqueue then cancel (a cancel that ran first in Redis made the
		// enqueue a no-op, which the pair adjacent in this order equals).
		return st.drop(in.id)
	case swRelease:
		if st.holds(in.id) != ok {
			return false
		}
		st.drop(in.id)
		return true
	}
	return false
}

// TestSemaphoreWaitModelCanFail: the waiting path's model rejects the
// histories of the bugs the check is for, and accepts their correct
// versions. Each history is sequential (operation i takes [2i, 2i+1]).
func TestSemaphoreWaitModelCanFail(t *testing.T) {
	try := func(id int, n int64, ok bool) semWaitOp { return semWaitOp{semWaitIn{kind: swTry, id: id, n: n}, ok} }
	enq := func(id int, n, seq int64) semWaitOp {
		return semWaitOp{semWaitIn{kind: swEnqueue, id: id, n: n, seq: seq}, true}
	}
	op := func(k semWaitKind, id int, ok bool) semWaitOp { return semWaitOp{semWaitIn{kind: k, id: id}, ok} }
	for _, c := range []struct {
		name string
		ok   bool
		ops  []semWaitOp
	}{
		{"full, then refused", true, []semWaitOp{try(1, 3, true), try(2, 2, false), try(3, 1, true)}},
		{"one permit too many", false, []semWaitOp{try(1, 3, true), try(2, 2, true)}},
		{"a release grants the head", true, []semWaitOp{try(1, 4, true), enq(2, 3, 1), enq(3, 1, 2),
			op(swRelease, 1, true), op(swGranted, 2, true), op(swGranted, 3, true)}},
		{"a waiter overtakes the head that does not fit", false, []semWaitOp{try(1, 2, true), enq(2, 3, 1), enq(3, 1, 2),
			op(swGranted, 3, true)}},
		{"a try jumps the queue", false, []semWaitOp{try(1, 2, true), enq(2, 3, 1), try(3, 1, true)}},
		{"places out of order", false, []semWaitOp{try(1, 4, true), enq(2, 1, 2), enq(3, 1, 1)}},
		{"a cancel gives back a raced grant", true, []semWaitOp{try(1, 4, true), enq(2, 2, 1),
			op(swRelease, 1, true), op(swCancel, 2, true), try(3, 4, true)}},
		{"a cancel keeps a raced grant", false, []semWaitOp{try(1, 4, true), enq(2, 2, 1),
			op(swRelease, 1, true), op(swCancel, 2, true), try(3, 4, false)}},
		{"a cancelled waiter still granted", false, []semWaitOp{try(1, 4, true), enq(2, 2, 1),
			op(swCancel, 2, true), op(swRelease, 1, true), op(swGranted, 2, true)}},
	} {
		var history []porcupine.Operation
		for i, o := range c.ops {
			history = append(history, porcupine.Operation{Input: o.in, Output: o.ok, Call: int64(2 * i), Return: int64(2*i + 1)})
		}
		if got := porcupine.CheckOperations(semWaitModel(4), history); got != c.ok {
			t.Errorf("%s: linearizable %v, want %v", c.name, got, c.ok)
		}
	}
}

// semWaitOp is an operation of TestSemaphoreWaitModelCanFail's histories.
type semWaitOp struct {
	in semWaitIn
	ok bool
}
