package main

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
)

//go:embed prices.json
var defaultPrices []byte

// priceFile is the shape of prices.json and of a -prices file: a price per
// region (ISO 3166-1 alpha-2) in units of the currency, and the price of a
// region the file does not list.
type priceFile struct {
	Currency string            `json:"currency"`
	Note     string            `json:"note,omitempty"`
	Default  string            `json:"default"`
	Prices   map[string]string `json:"prices"`
}

// priceTable is what one SMS to a region costs, in micros of currency.
// The table shipped with the service is read first, then a -prices file
// over it; the provider may update a region's price from what it reports
// (Twilio's price of each message). Safe for concurrent use.
type priceTable struct {
	currency string
	mu       sync.RWMutex
	byRegion map[string]micros
	fallback micros // a region the table does not list
}

// loadPrices returns the shipped table, with the file at path (if any)
// read over it: the file's prices replace the shipped ones, its default
// the default; its currency must be the table's.
func loadPrices(path string) (*priceTable, error) {
	p := &priceTable{byRegion: map[string]micros{}}
	if err := p.read(defaultPrices, "prices.json"); err != nil {
		return nil, err
	}
	if path == "" {
		return p, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: -prices: %w", errConfig, err)
	}
	return p, p.read(b, path)
}

// read takes the prices of one file over p's.
func (p *priceTable) read(b []byte, name string) error {
	var f priceFile
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("%w: prices %s: %w", errConfig, name, err)
	}
	switch {
	case p.currency == "":
		p.currency = f.Currency
	case f.Currency != "" && f.Currency != p.currency:
		return fmt.Errorf("%w: prices %s: currency %s; the table's is %s", errConfig, name, f.Currency, p.currency)
	}
	if f.Default != "" {
		m, err := parseMoney(f.Default)
		if err != nil {
			return fmt.Errorf("%w: prices %s: default: %w", errConfig, name, err)
		}
		p.fallback = m
	}
	for region, s := range f.Prices {
		m, err := parseMoney(s)
		if err != nil || m == 0 {
			return fmt.Errorf("%w: prices %s: %s: want a positive amount: %v", errConfig, name, region, err)
		}
		p.byRegion[strings.ToUpper(region)] = m
	}
	if p.fallback <= 0 {
		return fmt.Errorf("%w: prices %s: want a positive default", errConfig, name)
	}
	return nil
}

// price is what one SMS to region costs.
func (p *priceTable) price(region string) micros {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if m, ok := p.byRegion[region]; ok {
		return m
	}
	return p.fallback
}

// learn sets region's price to one the provider reported in currency: the
// next sends to region are charged what the last one cost. A price in
// another currency, or of nothing, is ignored.
func (p *priceTable) learn(region, currency string, m micros) bool {
	if !strings.EqualFold(currency, p.currency) || m <= 0 || m > maxMoney {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.byRegion[region] = m
	return true
}
