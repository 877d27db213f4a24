package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/big"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed check.lua
	checkSrc    string
	checkScript = redis.NewScript(checkSrc)
)

// verdict is the outcome of a verification. Its values are check.lua's
// replies.
type verdict int

const (
	noCode    verdict = 0 // never sent, expired, used or spent: the same answer as wrong
	verified  verdict = 1 // right: the code is used, by this verification
	wrongCode verdict = 2 // compared with a live code, and counted against it
	locked    verdict = 3 // the number is locked out: a live code, not compared
	spentCode verdict = 4 // wrong, and the last attempt: counted, and the code is spent by it
)

// recordTTL is how long a used or spent code's hash keeps the replies of its
// comparisons, for go-redis's retries of a script whose reply was lost.
const recordTTL = 10 * time.Second

// codeStore keeps one code per number in Redis, as an HMAC, never in clear.
type codeStore struct {
	client      redis.UniversalClient
	secret      []byte
	ttl         time.Duration
	maxAttempts int64 // wrong guesses that spend a code
}

// newCode returns 6 uniformly random digits from crypto/rand.
func newCode() string {
	n, err := rand.Int(rand.Reader, big.NewInt(1_000_000))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return fmt.Sprintf("%06d", n.Int64())
}

func (s *codeStore) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, s.secret)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// key hides the number: the code of a number lives under its HMAC.
func (s *codeStore) key(phone string) string {
	return "sms:code:" + base64.RawURLEncoding.EncodeToString(s.mac("phone", phone))
}

// put stores a new code for phone, replacing any earlier one, and the
// replies check.lua kept for the earlier one (see check.lua for the hash's
// fields), with a note of its send (n: see sendNote).
func (s *codeStore) put(ctx context.Context, phone, code, note string) error {
	key := s.key(phone)
	_, err := s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, key)
		p.HSet(ctx, key, "m", hex.EncodeToString(s.mac("code", phone, code)), "a", 0, "n", note)
		p.Expire(ctx, key, s.ttl)
		return nil
	})
	return err
}

// forget deletes the code of phone (its message could not be sent).
func (s *codeStore) forget(ctx context.Context, phone string) error {
	return s.client.Del(ctx, s.key(phone)).Err()
}

// A guess is one verification of a code: the MAC it is compared by, and
// the nonce under which check.lua keeps its reply.
type guess struct {
	key   string
	mac   string
	nonce string
}

// guess prepares the verification of code for phone.
func (s *codeStore) guess(phone, code string) guess {
	return guess{
		key: s.key(phone),
		// The guess's MAC is computed before Redis is asked, with or
		// without a code: a number with a pending code must not take
		// longer to answer.
		mac: hex.EncodeToString(s.mac("code", phone, code)),
		// One nonce per verification: check.lua run again with it (by a
		// retry of go-redis after a lost reply, or by check's caller after
		// an error) answers as the first run did.
		nonce: rand.Text(),
	}
}

// check decides g in one script, atomically: noCode when phone has no live
// code, verified for the one verification that used the code, wrongCode
// when g was compared and counted, spentCode when it was the maxAttempts-th
// (counted, and the code is spent), and, with lockedOut, locked when a code is live (nothing is compared).
// A right guess is not an attempt, so a right code verifies once however
// many verifications of it or wrong guesses run beside it, as long as fewer
// than maxAttempts wrong ones came first. Run again with the same g, check
// answers as the first time and changes nothing.
func (s *codeStore) check(ctx context.Context, g guess, lockedOut bool) (verdict, error) {
	mode := "1"
	if lockedOut {
		mode = "0"
	}
	reply, err := checkScript.Run(ctx, s.client, []string{g.key}, g.mac, s.maxAttempts, g.nonce, recordTTL.Milliseconds(), mode).Int()
	if err != nil {
		return noCode, err
	}
	if v := verdict(reply); v >= noCode && v <= spentCode {
		return v, nil
	}
	return noCode, fmt.Errorf("check.lua replied %d", reply)
}

// outstanding returns how long the code of phone lives yet: 0 when there
// is none that a verification could use (never sent, expired, used or
// spent: a used or spent code's hash keeps only check.lua's replies).
func (s *codeStore) outstanding(ctx context.Context, phone string) (time.Duration, error) {
	key := s.key(phone)
	var live *redis.BoolCmd
	var ttl *redis.DurationCmd
	_, err := s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		live, ttl = p.HExists(ctx, key, "m"), p.PTTL(ctx, key)
		return nil
	})
	if err != nil || !live.Val() {
		return 0, err
	}
	return max(ttl.Val(), 0), nil
}
