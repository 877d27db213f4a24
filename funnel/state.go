package funnel

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The state of a key is a Redis hash with one field per rule (rule.id). A
// value is "<wait>:<fill>:<at>", three integers in base 36 (short: every
// active key stores them), and, when the one-round-trip admission wrote it
// (admit.lua), ":<nonce>" after them: <fill> and <at> are the rule's level,
// and <wait> how long after <at> the rule has room for one unit again, or 0
// when it has room now. The read script denies without the lock while TIME
// is before <at> + <wait>: the rule's gate. (A gate is later than <at>, so a
// server clock behind <at> cannot make it deny where the level would admit.)
//
// A window's value has the same shape, so that every script reads it as it
// reads a funnel's: "<wait>:<log>:<at>[:<nonce>]", where <wait> is how long
// after <at> the window has room for one unit (until its oldest unit
// leaves; 0 if it has room), and <log> lists the times of its units, oldest
// first, each as <at> minus the time in base 36 (less than the window's
// length), separated by ','; a run of c units taken at one time is written
// once, "<offset>*<c>" (c in base 36). An entry takes at most 14 bytes
// (13 base-36 digits hold any int64, and the comma), so a window of n units
// stores at most 14n bytes of log.
//
// A calendar rule's value is a funnel's, "<wait>:<count>:<at>": <count> is
// the units of the period that holds <at> (a count of an earlier period is
// 0 at any later time), and <wait> is 0 while one more fits, else how long
// after <at> that period ends.

// encode returns the stored value of a rule whose funnel holds fill at
// server time at.
func (r rule) encode(fill, at int64) string {
	wait := r.wait(fill, 1)
	switch {
	case r.shared:
		wait = 0
	case r.cal != nil:
		wait = r.calendarWait(fill, at, 1)
	}
	b := make([]byte, 0, 32)
	b = strconv.AppendInt(b, wait, 36)
	b = append(b, ':')
	b = strconv.AppendInt(b, fill, 36)
	b = append(b, ':')
	b = strconv.AppendInt(b, at, 36)
	return string(b)
}

// appendWindow appends the stored value of window r holding the units log
// (live at at, ascending) at server time at, but <at>: "<wait>:<log>:".
func (r rule) appendWindow(b []byte, log []int64, at int64) []byte {
	b = strconv.AppendInt(b, r.gate(r.windowWait(log, at, 1)), 36)
	b = append(b, ':')
	for i := 0; i < len(log); {
		j := i + 1
		for j < len(log) && log[j] == log[i] {
			j++
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, at-log[i], 36)
		if j-i > 1 {
			b = append(b, '*')
			b = strconv.AppendInt(b, int64(j-i), 36)
		}
		i = j
	}
	return append(b, ':')
}

// encodeWindow returns the stored value of window r holding the units log
// (live at at) at server time at.
func (r rule) encodeWindow(log []int64, at int64) string {
	b := r.appendWindow(make([]byte, 0, 32+8*len(log)), log, at)
	return string(strconv.AppendInt(b, at, 36))
}

// parseWindow reads the units in a window's stored value, and reports
// whether it has the stored values' shape with at most r.full units, in
// order, none after <at>.
func (r rule) parseWindow(s string) (level, bool) {
	logs, at, ok := parseWindowHead(s)
	if !ok {
		return level{}, false
	}
	var log []int64
	prev := int64(math.MaxInt64)
	for e := range strings.SplitSeq(logs, ",") {
		off, count, ok := parseLogEntry(e)
		if !ok || off > prev || off > at || count > r.most()-int64(len(log)) {
			return level{}, false
		}
		prev = off
		for range count {
			log = append(log, at-off)
		}
	}
	return level{fill: int64(len(log)), at: at, log: &log}, true
}

// parseWindowHead splits a window's stored value, <tag>:<log>:<at>[:<nonce>],
// into its log (not empty) and its time.
func parseWindowHead(s string) (logs string, at int64, ok bool) {
	_, rest, ok1 := strings.Cut(s, ":")
	logs, ats, ok2 := strings.Cut(rest, ":")
	ats, nonce, _ := strings.Cut(ats, ":")
	at, ok3 := parseBase36(ats)
	return logs, at, ok1 && ok2 && ok3 && !strings.Contains(nonce, ":") && logs != ""
}

// parseLogEntry reads one entry of a window's log: <offset>, or
// <offset>*<count> for count >= 1 units at one time.
func parseLogEntry(e string) (off, count int64, ok bool) {
	offs, counts, several := strings.Cut(e, "*")
	off, ok = parseBase36(offs)
	if !several {
		return off, 1, ok
	}
	count, ok2 := parseBase36(counts)
	return off, count, ok && ok2 && count >= 1
}

// decode reads a stored value; a missing one (nil) is an empty funnel.
func (r rule) decode(v any) (level, error) {
	if v == nil {
		return level{}, nil
	}
	s, ok := v.(string)
	if !ok {
		return level{}, fmt.Errorf("%w: field %q holds %T", ErrCorruptState, r.id, v)
	}
	if r.window > 0 {
		lv, ok := r.parseWindow(s)
		if !ok {
			return level{}, fmt.Errorf("%w: field %q holds %q", ErrCorruptState, r.id, s)
		}
		return lv, nil
	}
	lv, ok := parseLevel(s)
	if !ok || lv.fill > r.full && !r.shared {
		return level{}, fmt.Errorf("%w: field %q holds %q", ErrCorruptState, r.id, s)
	}
	return lv, nil
}

// gate is the stored wait of r for the wait w: 0 for a shared rule.
func (r rule) gate(w int64) int64 {
	if r.shared {
		return 0
	}
	return w
}

// most is the most units a stored window may hold for r: its n, or for a
// shared rule the most any window holds.
func (r rule) most() int64 {
	if r.shared {
		return MaxWindow
	}
	return r.full
}

// parseLevel reads the level in a stored value, and reports whether it has
// the stored values' shape.
func parseLevel(s string) (level, bool) {
	if strings.Count(s, ":") > 3 {
		return level{}, false
	}
	_, rest, ok1 := strings.Cut(s, ":") // the wait: the read script's business
	fills, ats, ok2 := strings.Cut(rest, ":")
	ats, _, _ = strings.Cut(ats, ":") // a nonce, if admit.lua wrote the value
	fill, ok3 := parseBase36(fills)
	at, ok4 := parseBase36(ats)
	return level{fill: fill, at: at}, ok1 && ok2 && ok3 && ok4
}

// parseBase36 reads a stored integer, which is never negative.
func parseBase36(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 36, 64)
	return n, err == nil && n >= 0
}

// snapshot is what the read script returned: the server time and the stored
// levels of the call's rules.
type snapshot struct {
	now    int64
	levels []level
}

// parseRead reads the read script's result after proceed: {now, value...}.
func parseRead(rules []rule, res any) (snapshot, error) {
	arr, ok := res.([]any)
	if !ok || len(arr) != len(rules)+1 {
		return snapshot{}, fmt.Errorf("%w: read returned %T %v", ErrCorruptState, res, res)
	}
	now, ok := arr[0].(int64)
	if !ok {
		return snapshot{}, fmt.Errorf("%w: read returned time %T", ErrCorruptState, arr[0])
	}
	s := snapshot{now: now, levels: make([]level, len(rules))}
	for i, r := range rules {
		lv, err := r.decode(arr[i+1])
		if err != nil {
			return snapshot{}, err
		}
		s.levels[i] = lv
	}
	return s, nil
}

// writeArgs returns the write script's arguments for rules holding fills at
// server times ats (windows: the units logs, nil if none), written at now,
// refused from server time deadline (noDeadline: never): the key's TTL in
// ms (until every funnel is empty and every window holds no unit), the
// deadline, then field, value pairs; an empty funnel's value is "" (its
// field is deleted). The TTL and the deadline are passed as pointers into
// one allocation (go-redis writes *int64 as the number): boxing each int64
// would allocate twice.
func writeArgs(rules []rule, fills, ats []int64, logs [][]int64, now, deadline int64) []any {
	head := &[2]int64{0, deadline}
	args := make([]any, 2, 2+2*len(rules))
	args[0], args[1] = &head[0], &head[1]
	var ttl int64
	for i, r := range rules {
		if fills[i] == 0 {
			args = append(args, r.arg, emptyArg)
			continue
		}
		if r.window > 0 {
			ttl = max(ttl, ceilDiv(r.windowEmpty(logs[i], now), 1000))
			args = append(args, r.arg, r.encodeWindow(logs[i], ats[i]))
			continue
		}
		empty := satAdd(ats[i]-now, ceilDiv(fills[i], r.leak)) // µs from now
		if r.cal != nil {
			empty = ats[i] - now + r.calendarEmpty(fills[i], ats[i])
		}
		ttl = max(ttl, ceilDiv(empty, 1000))
		args = append(args, r.arg, r.encode(fills[i], ats[i]))
	}
	head[0] = min(ttl, maxTTL)
	return args
}

// emptyArg deletes a rule's field (boxed once).
var emptyArg any = ""

// maxTTL is the longest state TTL written, in ms: the largest that a client
// can hold as a time.Duration (about 292 years; miniredis, for one, wraps
// past it and deletes the key at once). A key whose funnels need longer to
// drain forgets their levels 292 years after its last write.
const maxTTL = math.MaxInt64 / int64(time.Millisecond)
