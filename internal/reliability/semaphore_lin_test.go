package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/funnelguard/funnelguard/internal/testmust"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// semLinIn is one call: TryAcquire of n permits (acquire true) that
// became permit id, or Release of permit id.
type semLinIn struct {
	acquire bool
	id      int
	n       int64
}

// semLinSize is the semaphore's size in the linearizability check.
const semLinSize = 3

// semLinModel is a semaphore of semLinSize permits: its state is the held
// permits as "id:n" sorted and joined with spaces. TryAcquire succeeds if
// and only if its permits fit (nobody waits in this check); a Release
// succeeds if and only if its permit is held.
var semLinModel = porcupine.Model{
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in, ok := input.(semLinIn), output.(bool)
		held := strings.Fields(state.(string))
		var sum int64
		for _, h := range held {
			var id int
			var n int64
			_, _ = fmt.Sscanf(h, "%d:%d", &id, &n)
			sum += n
		}
		me := fmt.Sprintf("%d:%d", in.id, in.n)
		if in.acquire {
			fits := sum+in.n <= semLinSize
			if !ok || !fits {
				return ok == fits, state
			}
			held = append(held, me)
			slices.Sort(held)
			return true, strings.Join(held, " ")
		}
		i := slices.Index(held, me)
		if i < 0 || !ok {
			return (i >= 0) == ok, state
		}
		return true, strings.Join(slices.Delete(held, i, i+1), " ")
	},
	DescribeOperation: func(input, output any) string {
		in := input.(semLinIn)
		if in.acquire {
			return fmt.Sprintf("TryAcquire(%d) #%d -> %v", in.n, in.id, output)
		}
		return fmt.Sprintf("Release #%d -> %v", in.id, output)
	},
}

// TestSemaphoreLinearizable: 8 goroutines on 2 Lockers call TryAcquire and
// Release; the history, with each call's start and end, must be that of
// one semaphore taking the calls one at a time (porcupine): a TryAcquire
// refused only when its permits did not fit, granted only when they did.
func TestSemaphoreLinearizable(t *testing.T) {
	b := testutil.RealBackend(t)
	sems := []*mutex.Semaphore{
		testmust.Semaphore(t, mustLocker(t, b.Client(t), mutex.WithPrefix(b.Prefix)), "lin", semLinSize),
		testmust.Semaphore(t, mustLocker(t, b.Client(t), mutex.WithPrefix(b.Prefix)), "lin", semLinSize),
	}
	start := time.Now()
	var mu sync.Mutex
	var history []porcupine.Operation
	var ids int
	record := func(client int, in semLinIn, call time.Time, ok bool) {
		mu.Lock()
		defer mu.Unlock()
		history = append(history, porcupine.Operation{ClientId: client, Input: in,
			Call: int64(call.Sub(start)), Output: ok, Return: int64(time.Since(start))})
	}
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() { errs <- semLinClient(sems[c%2], c, record, &mu, &ids) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	res := porcupine.CheckOperationsTimeout(semLinModel, history, time.Minute)
	if res != porcupine.Ok {
		t.Fatalf("%d calls: not linearizable (%v)", len(history), res)
	}
	t.Logf("%d calls, linearizable", len(history))
}

func semLinClient(s *mutex.Semaphore, c int, record func(int, semLinIn, time.Time, bool), mu *sync.Mutex, ids *int) error {
	ctx := context.Background()
	var p *mutex.Permit
	var mine semLinIn
	for range 40 {
		call := time.Now()
		if p != nil {
			err := p.Release(ctx)
			if err != nil {
				return err
			}
			record(c, semLinIn{id: mine.id, n: mine.n}, call, true)
			p = nil
			continue
		}
		n := 1 + rand.Int64N(semLinSize)
		q, err := s.TryAcquire(ctx, n, mutex.WithTTL(time.Minute))
		if err != nil && !errors.Is(err, mutex.ErrNoPermits) {
			return err
		}
		mu.Lock()
		*ids++
		mine = semLinIn{acquire: true, id: *ids, n: n}
		mu.Unlock()
		record(c, mine, call, err == nil)
		p = q
		time.Sleep(time.Duration(rand.IntN(2)) * time.Millisecond)
	}
	if p != nil {
		call := time.Now()
		if err := p.Release(ctx); err != nil {
			return err
		}
		record(c, semLinIn{id: mine.id, n: mine.n}, call, true)
	}
	return nil
}
