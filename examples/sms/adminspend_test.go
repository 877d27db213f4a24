package main

import (
	"fmt"
	"net/http"
	"testing"
)

// The operators see today's spend by country, the shares, and the scopes
// the pools refused, with the figures behind each.
func TestAdminSpendAndPools(t *testing.T) {
	a := newAdminEnv(t, moneyOn, func(c *Config) { c.Pools, c.Spend = defaultPools(), defaultSpend() })
	refused := 0
	for i := range 30 {
		r := a.send(fmt.Sprintf("+86138005%05d", i), "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", i))
		if r.status == http.StatusTooManyRequests && r.body.Rule == rulePooledPending {
			refused++
		}
	}
	if refused == 0 {
		t.Fatalf("30 codes to one prefix, none verified: none held by the pools")
	}
	var spend spendState
	a.api("GET", "/api/spend", "", &spend)
	if !spend.On || spend.Currency != "USD" || len(spend.Countries) != 1 || spend.Countries[0].Country != "CN" ||
		spend.Limit != "100.00" || spend.Share != "5.00" {
		t.Fatalf("GET /api/spend = %+v", spend)
	}
	var pools struct {
		On    bool        `json:"on"`
		Pools []poolState `json:"pools"`
	}
	a.api("GET", "/api/pools", "", &pools)
	if !pools.On || len(pools.Pools) == 0 || pools.Pools[0].Why == nil || pools.Pools[0].Country != "CN" {
		t.Fatalf("GET /api/pools = %+v", pools)
	}
	t.Logf("spend %+v; pools %+v why %+v", spend, pools.Pools[0], *pools.Pools[0].Why)
}
