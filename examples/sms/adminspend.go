package main

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The operators' view of the money and the pools: GET /api/spend (today's
// spend by country, the day's cap, the open part and each country's
// share) and GET /api/pools (the prefixes, groups and countries refused
// lately, paused or held, with the figures behind each refusal).

// countrySpend is one country's money today.
type countrySpend struct {
	Country   string `json:"country"`
	Spent     string `json:"spent"`      // today, in units of the currency
	Price     string `json:"price"`      // what one SMS costs now
	ShareLeft string `json:"share_left"` // of its unverified share
	ShareCap  string `json:"share_cap"`  // its share today: Share, widened by its verified codes
	Verified  int64  `json:"verified"`   // its codes verified in the last 24 hours (the pools' tally)
}

type spendState struct {
	On        bool           `json:"on"`
	Currency  string         `json:"currency"`
	Day       string         `json:"day"`
	Limit     string         `json:"limit"`
	Left      string         `json:"left"`
	OpenLeft  string         `json:"open_left"` // outside the reserve
	Share     string         `json:"share"`     // each country's at least
	Countries []countrySpend `json:"countries"`
}

// adminSpend answers GET /api/spend.
func (s *Service) adminSpend(w http.ResponseWriter, r *http.Request) {
	out := spendState{On: s.money != nil, Currency: s.prices.currency, Countries: []countrySpend{}}
	if s.money == nil {
		writeAny(w, http.StatusOK, out)
		return
	}
	c := s.cfg.Spend
	out.Limit, out.Share = c.Daily.String(), c.Daily.share(c.SharePPM).String()
	err := s.bounded(r.Context(), func(ctx context.Context) error {
		now, err := s.client.Time(ctx).Result()
		if err != nil {
			return err
		}
		out.Day = s.day(now)
		spent, err := s.client.HGetAll(ctx, spentKey(out.Day)).Result()
		if err != nil {
			return err
		}
		left, err := s.money.spend.Peek(ctx, budgetKey)
		if err != nil {
			return err
		}
		open, err := s.money.open.Peek(ctx, budgetKey)
		if err != nil {
			return err
		}
		out.Left, out.OpenLeft = micros(left.Remaining).String(), micros(open.Remaining).String()
		for region, v := range spent {
			var verified int64
			if s.pools != nil {
				if verified, err = s.pools.verifiedOf(ctx, region, now); err != nil {
					return err
				}
			}
			price := s.prices.price(region)
			c := s.money.shareCharge(s.cfg, price, verified)
			share, err := c.g.Peek(c.context(ctx), region)
			if err != nil {
				return err
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			out.Countries = append(out.Countries, countrySpend{Country: region, Spent: micros(n).String(),
				Price: price.String(), ShareLeft: micros(share.Remaining).String(),
				ShareCap: micros(c.rule.Capacity).String(), Verified: verified})
		}
		return nil
	})
	if err != nil {
		s.unavailable(w)
		return
	}
	sort.Slice(out.Countries, func(i, j int) bool { return out.Countries[i].Country < out.Countries[j].Country })
	s.log.Info("admin: spend read")
	writeAny(w, http.StatusOK, out)
}

// poolState is one scope refused lately.
type poolState struct {
	Scope       string       `json:"scope"`   // prefix, group, country
	Country     string       `json:"country"` // its region
	Prefix      string       `json:"prefix,omitempty"`
	Paused      bool         `json:"paused"` // false: held, or refused by velocity, at its last refusal
	Left        int64        `json:"left,omitempty"`
	LastRefused time.Time    `json:"last_refused"`
	Why         *poolRefusal `json:"why"` // the last refusal's rule and figures
}

// adminPools answers GET /api/pools: the 100 scopes refused last.
func (s *Service) adminPools(w http.ResponseWriter, r *http.Request) {
	out := struct {
		On    bool        `json:"on"`
		Pools []poolState `json:"pools"`
	}{On: s.pools != nil, Pools: []poolState{}}
	err := s.bounded(r.Context(), func(ctx context.Context) (err error) {
		if s.pools != nil {
			out.Pools, err = s.pools.listing(ctx)
		}
		return err
	})
	if err != nil {
		s.unavailable(w)
		return
	}
	s.log.Info("admin: pools read", "refused", len(out.Pools))
	writeAny(w, http.StatusOK, out)
}

// listing reads the index of refused scopes, newest first.
func (p *pools) listing(ctx context.Context) ([]poolState, error) {
	zs, err := p.client.ZRevRangeWithScores(ctx, poolIndex, 0, 99).Result()
	if err != nil {
		return nil, err
	}
	out := []poolState{}
	for _, z := range zs {
		member, _ := z.Member.(string)
		parts := strings.SplitN(member, "|", 4)
		if len(parts) != 4 {
			continue
		}
		st := poolState{Scope: parts[0], Country: parts[1], Prefix: parts[2], LastRefused: time.Unix(int64(z.Score), 0).UTC()}
		why, err := p.client.HGet(ctx, poolWhy, member).Result()
		if err != nil && err != redis.Nil {
			return nil, err
		}
		_ = json.Unmarshal([]byte(why), &st.Why)
		left, err := p.client.PTTL(ctx, parts[3]).Result()
		if err != nil {
			return nil, err
		}
		st.Paused, st.Left = left > 0, *seconds(max(left, 0))
		out = append(out, st)
	}
	return out, nil
}
