package main

import (
	"context"
	"errors"
	"time"
)

// What a send costs and what a verified code gives back: the money of a
// send is recorded per country and day when it is delivered; a verified
// code counts as verified in the pools of its send, gives its price back to
// its country's unverified share, and its unit back to the address it was
// verified from, so that an address whose numbers verify (ten people
// behind one carrier-grade NAT) is held only for the codes nobody uses.

// spentKey is the hash of the money spent on the budget's day, by region.
func spentKey(day string) string { return "sms:spent:" + day }

// spent records price, spent on a code delivered to dest, for the
// metrics and, with the money guards on, the operators (today's spend by
// country). A failure is
// logged: the code went out all the same.
func (s *Service) spent(ctx context.Context, dest destination, price micros) {
	s.metrics.spend.WithLabelValues(dest.Region).Add(float64(price))
	if s.money == nil {
		return
	}
	var total int64
	err := s.bounded(context.WithoutCancel(ctx), func(ctx context.Context) error {
		now, err := s.client.Time(ctx).Result()
		if err != nil {
			return err
		}
		key := spentKey(s.day(now))
		total, err = s.client.HIncrBy(ctx, key, dest.Region, int64(price)).Result()
		if err == nil {
			err = s.client.Expire(ctx, key, 48*time.Hour).Err()
		}
		return err
	})
	if err != nil {
		s.log.Warn("recording a code's price failed", "country", dest.Region, "err", err)
		return
	}
	s.metrics.spentToday.WithLabelValues(dest.Region).Set(float64(total))
}

// day is the budget's day of t: its date in -budget-tz.
func (s *Service) day(t time.Time) string {
	zone := s.cfg.BudgetZone
	if zone == nil {
		zone = time.UTC
	}
	return t.In(zone).Format(time.DateOnly)
}

// credit gives back what the verified code of dest's send took beyond its
// use: see above. codeKey is the code's hash (its note is kept there for a
// few seconds after its use), ip the address it was verified from. Failures
// are logged: the code is used all the same.
func (s *Service) credit(ctx context.Context, dest destination, codeKey, ip string) {
	var raw string
	err := s.bounded(ctx, func(ctx context.Context) (err error) {
		raw, err = s.client.HGet(ctx, codeKey, "n").Result()
		return err
	})
	note, ok := parseNote(raw)
	if err != nil || !ok {
		s.log.Warn("a verified code's send is not known: nothing given back", "prefix", shownPrefix(dest), "err", err)
		return
	}
	if s.pools != nil && note.hour > 0 {
		s.logged("pools", s.bounded(ctx, func(ctx context.Context) error {
			return errors.Join(s.pools.add(ctx, dest, "v", note.hour, note.unproven, 1), s.pools.verified(ctx, dest, note.hour))
		}))
	}
	if s.money != nil && note.unproven {
		c := priced{g: s.money.share, rule: s.money.limits[s.money.share], n: int64(note.price)}
		s.logged("country-share", c.Refund(ctx, dest.Region))
	}
	if !addressCreditOff {
		s.logged("ip", s.ip.Refund(ctx, ip))
	}
}

func (s *Service) logged(what string, err error) {
	if err != nil {
		s.log.Warn("giving back a verified code's units failed", "guard", what, "err", err)
	}
}

// addressCreditOff turns off the unit a verified code gives back to its
// address: a test seam, for the campaigns replayed without it
// (campaign_test.go -campaign.off=credit).
var addressCreditOff bool
