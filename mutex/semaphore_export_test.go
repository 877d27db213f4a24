package mutex

import (
	"context"
	"strconv"
)

// SemScripts returns the SHA1 of the semaphore's acquire, release and
// extend scripts, by which SLOWLOG names their runs.
func SemScripts() (acquire, release, extend string) {
	return semAcquireScript.Hash(), semReleaseScript.Hash(), semExtendScript.Hash()
}

// SemPoll runs the acquire script for tok, a waiter of s queued at place
// seq (SemEnqueue's), as its next poll does; it reports whether tok holds
// its n permits.
func SemPoll(ctx context.Context, s *Semaphore, tok string, n, seq int64) (bool, error) {
	cfg, err := s.check(ctx, n, nil)
	if err != nil {
		return false, err
	}
	r, err := s.acquireOnce(ctx, tok, n, cfg, "w"+strconv.FormatInt(seq, 10))
	return err == nil && r[0] == semGranted, err
}
