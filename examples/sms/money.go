package main

import (
	"fmt"
	"strconv"
	"strings"
)

// micros is an amount of money in millionths of the currency's unit
// (USD 0.0079 is 7900): prices, spend caps and shares are counted in it,
// in integers, so that a day's spend is exact and fits the funnel's
// calendar rules (at most 2^61 units; the Lua that counts them is exact to
// 2^53, about 9 billion units of the currency).
type micros int64

// maxMoney bounds an amount the service takes: far above any daily cap,
// far below 2^53 micros.
const maxMoney micros = 1_000_000_000 * 1_000_000

// parseMoney reads an amount written in units of the currency with at most
// 6 decimals ("0.0079", "150", "12.5"), never through a float.
func parseMoney(s string) (micros, error) {
	whole, frac, _ := strings.Cut(strings.TrimSpace(s), ".")
	if whole == "" && frac == "" || len(frac) > 6 || strings.ContainsAny(whole+frac, "+-") {
		return 0, fmt.Errorf("%q: want an amount such as 0.0079 (at most 6 decimals)", s)
	}
	w, err := strconv.ParseInt("0"+whole, 10, 64)
	if err != nil || w > int64(maxMoney/1_000_000) {
		return 0, fmt.Errorf("%q: not an amount up to %d", s, maxMoney/1_000_000)
	}
	f, err := strconv.ParseInt("0"+frac+strings.Repeat("0", 6-len(frac)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: not an amount", s)
	}
	return micros(w*1_000_000 + f), nil
}

// String writes m in units with the decimals it needs, at least 2:
// "0.0079", "12.50".
func (m micros) String() string {
	sign := ""
	if m < 0 {
		sign, m = "-", -m
	}
	s := fmt.Sprintf("%s%d.%06d", sign, m/1_000_000, m%1_000_000)
	for strings.HasSuffix(s, "0") && len(s)-strings.Index(s, ".") > 3 {
		s = s[:len(s)-1]
	}
	return s
}

// share returns the part ppm (millionths) of m, rounded down.
func (m micros) share(ppm int64) micros {
	return micros(int64(m)/1_000_000*ppm + int64(m)%1_000_000*ppm/1_000_000)
}
