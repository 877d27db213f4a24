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
	// Set only in the cases that ask for them (benchCase.serverCmds):
	// commands run by Redis per op, from INFO commandstats, those called
	// from scripts included (serverStats), and script calls per op.
	InnerCmdsPerOp   *float64 `json:"inner_cmds_per_op,omitempty"`
	ScriptCallsPerOp *float64 `json:"script_calls_per_op,omitempty"`
	// PUBLISH calls per op and µs of Redis time in scripts per op (each
	// script's time once, its inner commands included).
	PublishPerOp  *float64 `json:"publish_per_op,omitempty"`
	ScriptUsPerOp *float64 `json:"script_us_per_op,omitempty"`
	// CPU time of Redis's main thread per op, µs (INFO cpu).
	ServerCPUUsOp *float64 `json:"server_cpu_us_per_op,omitempty"`
	// Set only in the cases with a reference library (benchCase.ref):
	// ops/s over the reference's.
	Ratio   *float64 `json:"ratio,omitempty"`
	RatioTo string   `json:"ratio_to,omitempty"`
}

// summarize takes the median of each metric over the rounds. µs/op is wall
// time per operation of the whole run (1e6 / ops/s), not per goroutine.
func summarize(bc benchCase, lib string, samples []sample) summary {
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
	perOp := func(f func(serverStats) int64) *float64 {
		v := med(func(s sample) float64 { return float64(f(s.server)) / float64(s.ops) })
		return &v
	}
	sum := summary{
		Case:        bc.name,
		Lib:         lib,
		OpsPerSec:   ops,
		MicrosPerOp: 1e6 / ops,
		AllocsPerOp: med(func(s sample) float64 { return float64(s.mallocs) / float64(s.ops) }),
		CmdsPerOp:   med(func(s sample) float64 { return float64(s.cmds) / float64(s.ops) }),
		ServerUsOp:  *perOp(func(s serverStats) int64 { return s.usec }),
		GaveUp:      int64(med(func(s sample) float64 { return float64(s.gaveUp) })),
		Rounds:      len(samples),
	}
	if bc.serverCmds {
		sum.InnerCmdsPerOp = perOp(func(s serverStats) int64 { return s.inner })
		sum.ScriptCallsPerOp = perOp(func(s serverStats) int64 { return s.scripts })
		sum.PublishPerOp = perOp(func(s serverStats) int64 { return s.publish })
		sum.ScriptUsPerOp = perOp(func(s serverStats) int64 { return s.scriptUsec })
		sum.ServerCPUUsOp = perOp(func(s serverStats) int64 { return s.cpuUsec })
	}
	return sum
}

// setRatios sets the Ratio of each of a case's summaries to its ops/s over
// the reference library's, when the case names one.
func setRatios(bc benchCase, sums []summary) {
	i := slices.IndexFunc(sums, func(s summary) bool { return s.Lib == bc.ref })
	if bc.ref == "" || i < 0 {
		return
	}
	for j := range sums {
		if j == i {
			continue
		}
		r := sums[j].OpsPerSec / sums[i].OpsPerSec
		sums[j].Ratio, sums[j].RatioTo = &r, bc.ref
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
	table := func(title string, f func(summary) string) { writeTable(w, title, cases, libs, cell, f) }
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
	writeOptional(table)
	if len(mem) > 0 {
		fmt.Fprintf(w, "\nMemory\n\n| measure | %s | %s |\n|---|---:|---:|\n", libFunnel, libRedisRate)
		for _, r := range mem {
			fmt.Fprintf(w, "| %s (%s) | %d | %d |\n", r.name, r.unit, r.values[libFunnel], r.values[libRedisRate])
		}
	}
}

// writeTable writes a table of f's cells, a row per case and a column per
// library, leaving out the rows and columns where f returns "" for all.
func writeTable(w io.Writer, title string, cases, libs []string, cell map[[2]string]summary, f func(summary) string) {
	rows := make([][]string, 0, len(cases))
	used := make([]bool, len(libs))
	for _, c := range cases {
		row, some := make([]string, len(libs)), false
		for i, l := range libs {
			if s, ok := cell[[2]string{c, l}]; ok {
				row[i] = f(s)
			}
			used[i] = used[i] || row[i] != ""
			some = some || row[i] != ""
		}
		if some {
			rows = append(rows, append([]string{c}, row...))
		}
	}
	if len(rows) == 0 {
		return
	}
	keep := func(row []string) []string {
		out := row[:1:1]
		for i, v := range row[1:] {
			if used[i] {
				out = append(out, v)
			}
		}
		return out
	}
	head := keep(append([]string{"case"}, libs...))
	fmt.Fprintf(w, "\n%s\n\n| %s |\n|---|%s\n", title, strings.Join(head, " | "), strings.Repeat("---:|", len(head)-1))
	for _, row := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(keep(row), " | "))
	}
}

// writeOptional writes the tables of the metrics only some cases report:
// the ratio to a reference library, Redis commands per op.
func writeOptional(table func(string, func(summary) string)) {
	table("Ratio: ops/s over the reference library's (cases with one)", func(s summary) string {
		if s.Ratio == nil {
			return ""
		}
		return fmt.Sprintf("%.2f× %s", *s.Ratio, s.RatioTo)
	})
	table("Redis work per op (INFO commandstats deltas): commands run, those called from scripts included (not EVAL/EVALSHA, SCRIPT, INFO, HELLO, CLIENT); EVAL/EVALSHA calls; PUBLISH calls; µs in scripts; µs of Redis CPU (main thread)", func(s summary) string {
		if s.InnerCmdsPerOp == nil {
			return ""
		}
		return fmt.Sprintf("%.2f; %.2f; %.2f; %.1f; %.1f", *s.InnerCmdsPerOp, *s.ScriptCallsPerOp, *s.PublishPerOp, *s.ScriptUsPerOp, *s.ServerCPUUsOp)
	})
}
