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
	//go:embed attempt.lua
	attemptSrc    string
	attemptScript = redis.NewScript(attemptSrc)
	//go:embed consume.lua
	consumeSrc    string
	consumeScript = redis.NewScript(consumeSrc)
)

// verdict is the outcome of a verification.
type verdict int

const (
	verified verdict = iota
	wrongCode
	noCode  // never sent, expired, used or invalidated: the same answer as wrong
	tooMany // this attempt was past the code's limit
)

// usedRecord is how long a used code's hash keeps the nonce of its use.
const usedRecord = 10 * time.Second

// codeStore keeps one code per number in Redis, as an HMAC, never in clear.
type codeStore struct {
	client      redis.UniversalClient
	secret      []byte
	ttl         time.Duration
	maxAttempts int64
	// equal compares the stored MAC of a code with the MAC of a guess, both
	// 64 hex digits: hmac.Equal, in constant time. A field so that tests can
	// watch every comparison.
	equal func(stored, guess []byte) bool
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

// put stores a new code for phone, replacing any earlier one.
func (s *codeStore) put(ctx context.Context, phone, code string) error {
	key := s.key(phone)
	_, err := s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, key)
		p.HSet(ctx, key, "m", hex.EncodeToString(s.mac("code", phone, code)), "a", 0)
		p.Expire(ctx, key, s.ttl)
		return nil
	})
	return err
}

// forget deletes the code of phone (its message could not be sent).
func (s *codeStore) forget(ctx context.Context, phone string) error {
	return s.client.Del(ctx, s.key(phone)).Err()
}

// attempt is one verification of a code in progress: counted against the
// code, not yet compared.
type attempt struct {
	state  verdict // noCode, tooMany, or wrongCode until compared
	key    string
	stored string // the code's MAC, when there is a code
	guess  []byte
	nonce  string
}

// begin counts one attempt of code for phone: at most maxAttempts attempts
// per code are ever compared, however many run at once. The attempt's state
// is noCode when phone has no code outstanding (never sent, expired, used or
// invalidated), tooMany when this attempt is past the code's limit (the code
// is deleted), and wrongCode when the caller may compare.
func (s *codeStore) begin(ctx context.Context, phone, code string) (attempt, error) {
	a := attempt{state: noCode, key: s.key(phone)}
	// The guess's MAC is computed before Redis is asked, with or without a
	// code: a number with a pending code must not take longer to answer.
	a.guess = []byte(hex.EncodeToString(s.mac("code", phone, code)))
	// One nonce for this verification's scripts: run again by a retry of
	// go-redis (a lost reply), each answers as it did the first time.
	a.nonce = rand.Text()
	reply, err := attemptScript.Run(ctx, s.client, []string{a.key}, s.maxAttempts, a.nonce).Slice()
	if err != nil {
		return a, err
	}
	state, _ := reply[0].(int64)
	switch state {
	case 0:
		return a, nil
	case 2:
		a.state = tooMany
		return a, nil
	}
	a.state = wrongCode
	a.stored, _ = reply[1].(string)
	return a, nil
}

// finish compares the attempt's code, in constant time, and uses it once
// if it is right: verified for the one caller that used it.
func (s *codeStore) finish(ctx context.Context, a attempt) (verdict, error) {
	if a.state != wrongCode || !s.equal([]byte(a.stored), a.guess) {
		return a.state, nil
	}
	used, err := consumeScript.Run(ctx, s.client, []string{a.key}, a.stored, a.nonce, usedRecord.Milliseconds()).Int()
	if err != nil {
		return noCode, err
	}
	if used != 1 {
		return noCode, nil // another request used it first
	}
	return verified, nil
}
