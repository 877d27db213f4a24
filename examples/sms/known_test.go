package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
)

// A prefix that a real user verified a code from stays known for
// -prefix-memory: days later, while its country's codes to other
// prefixes are refused as not converting, a code to it is sent; after the
// memory it is judged like any other.
func TestKnownPrefixOutlivesTheDay(t *testing.T) {
	b := testutil.Mini(t)
	b.Mini.SetTime(campaignT0)
	s := newSim(t, b, "known prefixes")
	at := func(d time.Duration) {
		b.Mini.FastForward(d - s.now)
		s.now = d
		b.Mini.SetTime(campaignT0.Add(d))
	}
	user := s.number("DE", "")
	prefix := s.prefixOf(user)
	ip := s.newIP()
	if status, r := s.send(user, ip); status != http.StatusAccepted {
		t.Fatalf("a real user's code: %d %+v", status, r)
	}
	at(time.Minute)
	if status := s.verify(user, ip); status != http.StatusOK {
		t.Fatalf("its verification: %d", status)
	}

	// Three days later the prefix's own tallies are gone (24 h), and a
	// pumping ring sends DE codes nobody uses until the pools refuse them.
	at(72 * time.Hour)
	refusedBy := ""
	for i := 0; i < 40 && refusedBy == ""; i++ {
		n := s.number("DE", "")
		if s.prefixOf(n) == prefix {
			continue
		}
		status, r := s.send(n, s.newIP())
		if status == http.StatusTooManyRequests && (r.Scope == "country" || r.Scope == "group") {
			refusedBy = r.Scope + " " + r.Rule
		}
	}
	if refusedBy == "" {
		t.Fatal("40 DE codes to fresh prefixes, none verified: the pools refused none")
	}
	other := s.number("DE", "")
	for s.prefixOf(other) == prefix {
		other = s.number("DE", "")
	}
	if status, r := s.send(other, s.newIP()); status != http.StatusTooManyRequests {
		t.Fatalf("a code to another fresh prefix once the pools refused DE (%s): %d %+v", refusedBy, status, r)
	}
	if status, r := s.send(s.number("DE", prefix), s.newIP()); status != http.StatusAccepted {
		t.Fatalf("a code to the known prefix while DE is refused (%s): %d %+v; want it sent", refusedBy, status, r)
	}

	// Past the memory the prefix is no longer known.
	dest := destination{Region: "DE", Prefix: prefix}
	view := func() poolView {
		v, _, _, err := s.svc.pools.read(context.Background(), dest)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if !view().known {
		t.Fatal("the prefix is not known 3 days after its verified code")
	}
	at(time.Minute + s.svc.cfg.Pools.Memory + 2*time.Hour)
	if view().known {
		t.Fatalf("the prefix is still known %v after its verified code", s.svc.cfg.Pools.Memory)
	}
}

// The set of known prefixes holds one member per prefix, none older than
// the memory, and expires with the last of them.
func TestKnownPrefixesBounded(t *testing.T) {
	b := testutil.Mini(t)
	b.Mini.SetTime(campaignT0)
	s := newSim(t, b, "known set")
	p := s.svc.pools
	memory := int64(p.cfg.Pools.Memory / poolBucket)
	ctx := context.Background()
	start := hourOf(campaignT0)
	for i := range int64(100) {
		dest := destination{Region: "FR", Prefix: "+33" + string(rune('0'+i%10)) + "0000"}
		if err := p.verified(ctx, dest, start+i*memory/50); err != nil {
			t.Fatal(err)
		}
	}
	key := knownKey(destination{Region: "FR"})
	members, err := b.Mini.ZMembers(key)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 10 {
		t.Fatalf("%d members for 10 prefixes", len(members))
	}
	last := start + 99*memory/50
	for _, m := range members {
		score, _ := b.Mini.ZScore(key, m)
		if int64(score) <= last-memory {
			t.Errorf("a member of hour %d kept at hour %d (memory %d hours)", int64(score), last, memory)
		}
	}
	if ttl := b.Mini.TTL(key); ttl <= 0 || ttl > p.cfg.Pools.Memory+poolBucket {
		t.Errorf("the set's TTL is %v; want at most the memory and an hour", ttl)
	}
}
