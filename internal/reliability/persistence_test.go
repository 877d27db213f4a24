package reliability

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/mutex"
)

// TestRestartPersistence measures what a server restart (SIGKILL, then a new
// process on the same directory) does to a limit and a lock, without
// persistence and with an append-only file synced on every write. The
// README's "Server settings" quotes its figures.
//
// Without persistence the restarted server is empty: a key admitted 10 times
// under AtMost(10, time.Hour) is admitted 10 more times (20 in the hour),
// and a lock held for an hour is free to the next caller. With appendonly
// yes and appendfsync always, every write a client saw acknowledged is on
// disk before the reply: the key is still denied and the lock still held.
// (appendfsync everysec, Redis's default for AOF, may lose the last second
// of writes; what it loses depends on timing, so no test asserts it.)
func TestRestartPersistence(t *testing.T) {
	for _, tc := range []struct {
		name         string
		args         []string
		wantAdmitted int // of 20 calls, 10 before the restart and 10 after
		wantHeld     bool
	}{
		{"none", []string{"--save", "", "--appendonly", "no"}, 20, false},
		{"appendfsync always", []string{"--appendonly", "yes", "--appendfsync", "always"}, 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testutil.StartServerArgs(t, tc.args...)
			rule := funnel.AtMost(10, time.Hour)
			const key, name = "sms:+8613600000009", "order:42"
			allow := func(lim *funnel.Limiter) int {
				t.Helper()
				admitted := 0
				for range 10 {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					res, err := lim.Allow(ctx, key, rule)
					cancel()
					if err != nil {
						t.Fatalf("Allow: %v", err)
					}
					if res.Allowed {
						admitted++
					}
				}
				return admitted
			}
			tryLock := func(l *mutex.Locker) (*mutex.Lock, error) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				return l.TryLock(ctx, name)
			}

			c := srv.Client(t)
			before := allow(mustLimiter(t, c))
			if before != 10 {
				t.Fatalf("admitted %d of 10 before the restart, want 10", before)
			}
			// A lease of an hour: after the restart the lock is held, or lost,
			// never merely expired.
			if _, err := tryLock(mustLocker(t, c, mutex.WithTTL(time.Hour))); err != nil {
				t.Fatalf("TryLock before the restart: %v", err)
			}
			if err := srv.Restart(); err != nil {
				t.Fatalf("restart: %v", err)
			}

			// New clients, Limiter and Locker: nothing of the first ones'
			// connections or local state decides what follows.
			c2 := srv.Client(t)
			after := allow(mustLimiter(t, c2))
			_, err := tryLock(mustLocker(t, c2, mutex.WithTTL(time.Hour)))
			held := errors.Is(err, mutex.ErrLocked)
			if err != nil && !held {
				t.Fatalf("TryLock after the restart: %v", err)
			}
			faultFigure(t, "limits and locks across a restart", "SIGKILL + restart, persistence "+tc.name,
				"%d admitted under AtMost(10, 1h) (%d before, %d after); lock held after: %v", before+after, before, after, held)
			if before+after != tc.wantAdmitted || held != tc.wantHeld {
				t.Fatalf("%s: admitted %d, lock held %v; want %d, %v", tc.name, before+after, held, tc.wantAdmitted, tc.wantHeld)
			}
		})
	}
}
