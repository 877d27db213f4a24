package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// A summary is the median of one library's rounds in one case.
type summary struct {
	Case        string  `json:"case"`
	Lib         string  `json:"lib"`
	OpsPerSec   float64 `json:"ops_per_s"`
	MicrosPerOp float64 `json:"us_per_op"`
	XPing       float64 `json:"x_ping"`
	AllocsPerOp float64 `json:"allocs_per_op"`
	CmdsPerOp   float64 `json:"cmds_per_op"`
	ServerUsOp  float64 `json:"server_us_per_op"`
	GaveUp      int64   `json:"gave_up"` // waits that ended unacquired (median round)
	Rounds      int     `json:"rounds"`
}

// summarize takes the median of each metric over the rounds. µs/op is wall
// time per operation of the whole run (1e6 / ops/s), not per goroutine.
func summarize(caseName, lib string, samples []sample) summary {
	med := func(f func(sample) float64) float64 {
		v := make([]float64, len(samples))
		for i, s := range samples {
			v[i] = f(s)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	ops := med(sample.perSec)
	return summary{
		Case:        caseName,
		Lib:         lib,
		OpsPerSec:   ops,
		MicrosPerOp: 1e6 / ops,
		AllocsPerOp: med(func(s sample) float64 { return float64(s.mallocs) / float64(s.ops) }),
		CmdsPerOp:   med(func(s sample) float64 { return float64(s.cmds) / float64(s.ops) }),
		ServerUsOp:  med(func(s sample) float64 { return float64(s.usec) / float64(s.ops) }),
		GaveUp:      int64(med(func(s sample) float64 { return float64(s.gaveUp) })),
		Rounds:      len(samples),
	}
}

// writeJSON writes one JSON object per case and library, then one per
// memory row and library.
func writeJSON(w io.Writer, sums []summary, mem []memRow) error {
	enc := json.NewEncoder(w)
	for _, s := range sums {
		if err := enc.Encode(s); err != nil {
			return err
		}
	}
	for _, r := range mem {
		for _, lib := range []string{libFunnel, libRedisRate} {
			if err := enc.Encode(map[string]any{"case": "memory: " + r.name, "lib": lib, r.unit: r.values[lib]}); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeMarkdown writes the throughput table (cells "ops/s (×PING)"), the
// cost table (cells "cmds/op, allocs/op, µs/op") and the memory table.
func writeMarkdown(w io.Writer, sums []summary, mem []memRow, elapsed time.Duration, rounds int, d time.Duration, goroutines int) {
	var libs, cases []string
	cell := map[[2]string]summary{}
	for _, s := range sums {
		if !slices.Contains(libs, s.Lib) {
			libs = append(libs, s.Lib)
		}
		if !slices.Contains(cases, s.Case) {
			cases = append(cases, s.Case)
		}
		cell[[2]string{s.Case, s.Lib}] = s
	}
	table := func(title string, f func(summary) string) {
		fmt.Fprintf(w, "\n%s\n\n| case | %s |\n|---|%s\n", title, strings.Join(libs, " | "), strings.Repeat("---:|", len(libs)))
		for _, c := range cases {
			row := []string{c}
			for _, l := range libs {
				s, ok := cell[[2]string{c, l}]
				if !ok {
					row = append(row, "")
					continue
				}
				row = append(row, f(s))
			}
			fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		}
	}
	fmt.Fprintf(w, "Medians of %d rounds of %v each, %d goroutines in parallel cases; total %v.\n",
		rounds, d, goroutines, elapsed.Round(time.Second))
	table("Throughput: ops/s (×PING of the same mode)", func(s summary) string {
		return fmt.Sprintf("%.0f (%.2f×)", s.OpsPerSec, s.XPing)
	})
	table("Cost: Redis commands/op, allocs/op, µs/op (wall time / ops), server µs/op (commandstats)", func(s summary) string {
		out := fmt.Sprintf("%.2f, %.0f, %.1f, %.1f", s.CmdsPerOp, s.AllocsPerOp, s.MicrosPerOp, s.ServerUsOp)
		if s.GaveUp > 0 {
			out += fmt.Sprintf(", %d gave up", s.GaveUp)
		}
		return out
	})
	if len(mem) > 0 {
		fmt.Fprintf(w, "\nMemory\n\n| measure | %s | %s |\n|---|---:|---:|\n", libFunnel, libRedisRate)
		for _, r := range mem {
			fmt.Fprintf(w, "| %s (%s) | %d | %d |\n", r.name, r.unit, r.values[libFunnel], r.values[libRedisRate])
		}
	}
}
