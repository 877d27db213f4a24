package funnel

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The state of a key is a hash with one field per rule (rule.id) holding
// "<wait>:<fill>:<at>[:<nonce>]" in base 36: the level <fill> at server
// time <at>, and the gate: the read script denies without the lock while
// TIME is before <at> + <wait>. A one-script admission appends its nonce.
// A window's <fill> is its log: its units' times, oldest first, as offsets
// back from <at> separated by ',', a run of c units at one time written
// "<offset>*<c>". A calendar rule's <fill> counts the units of the period
// that holds <at>.

// encode returns r's stored value for lv.
func (r rule) encode(lv level) string {
	b := r.appendValue(make([]byte, 0, 32+8*len(lv.units())), lv)
	return string(strconv.AppendInt(b, lv.at, 36))
}

// appendValue appends r's value for lv but <at>: "<wait>:<fill>:", a
// window's <fill> its log (live at lv.at, ascending); a shared rule's wait
// is 0 (rule.shared).
func (r rule) appendValue(b []byte, lv level) []byte {
	wait := r.waitIn(lv, 1)
	if r.shared {
		wait = 0
	}
	b = strconv.AppendInt(b, wait, 36)
	b = append(b, ':')
	if r.window == 0 {
		b = strconv.AppendInt(b, lv.fill, 36)
		return append(b, ':')
	}
	log := lv.units()
	for i := 0; i < len(log); {
		j := i + 1
		for j < len(log) && log[j] == log[i] {
			j++
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, lv.at-log[i], 36)
		if j-i > 1 {
			b = append(b, '*')
			b = strconv.AppendInt(b, int64(j-i), 36)
		}
		i = j
	}
	return append(b, ':')
}

// parseWindow reads a window's value: false unless it has the shape, at
// most MaxWindow units (decode holds an unshared one to r's), in order,
// none after <at>.
func (r rule) parseWindow(s string) (level, bool) {
	logs, at, ok := splitValue(s)
	if !ok {
		return level{}, false
	}
	var log []int64
	prev := at // offsets go down from at most <at>; an empty log is an entry "", refused
	for e := range strings.SplitSeq(logs, ",") {
		off, count, ok := parseLogEntry(e)
		if !ok || off > prev || count > MaxWindow-int64(len(log)) {
			return level{}, false
		}
		prev = off
		for range count {
			log = append(log, at-off)
		}
	}
	return level{fill: int64(len(log)), at: at, log: &log}, true
}

// parseLogEntry reads <offset> or <offset>*<count> (count >= 1).
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
	s, _ := v.(string) // another type parses as "", which has not the shape
	parse := parseLevel
	if r.window > 0 {
		parse = r.parseWindow
	}
	lv, ok := parse(s)
	if !ok || lv.fill > r.full && !r.shared {
		return level{}, fmt.Errorf("%w: field %q holds %#v", ErrCorruptState, r.id, v)
	}
	return lv, nil
}

// parseLevel reads the level in a stored value; false if it has not the shape.
func parseLevel(s string) (level, bool) {
	fills, at, ok := splitValue(s)
	fill, ok2 := parseBase36(fills)
	if !ok || !ok2 {
		return level{}, false
	}
	return level{fill: fill, at: at}, true
}

// splitValue splits a stored value into its <fill> (a window's log) and
// <at>; false if it has not the shape.
func splitValue(s string) (fill string, at int64, ok bool) {
	_, rest, _ := strings.Cut(s, ":") // the wait: the read script's business; rest is "" without it
	fill, ats, ok1 := strings.Cut(rest, ":")
	ats, nonce, _ := strings.Cut(ats, ":") // a nonce, if a gate wrote the value
	at, ok2 := parseBase36(ats)
	return fill, at, ok1 && ok2 && !strings.Contains(nonce, ":")
}

func parseBase36(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 36, 64)
	return n, err == nil && n >= 0
}

// parseRead reads the read script's result after proceed: {now, value...},
// or penalty.lua's, which ends with the end of the key's box.
func parseRead(rules []rule, res any) (reading, error) {
	arr, _ := res.([]any) // another type has no length
	var till int64
	if len(arr) == len(rules)+2 {
		if t, ok := arr[len(arr)-1].(int64); ok {
			arr, till = arr[:len(arr)-1], t
		}
	}
	if len(arr) != len(rules)+1 {
		return reading{}, fmt.Errorf("%w: read returned %T %v", ErrCorruptState, res, res)
	}
	now, ok := arr[0].(int64)
	if !ok {
		return reading{}, fmt.Errorf("%w: read returned time %T", ErrCorruptState, arr[0])
	}
	s := reading{now: now, levels: make([]level, len(rules)), till: till}
	for i, r := range rules {
		lv, err := r.decode(arr[i+1])
		if err != nil {
			return reading{}, err
		}
		s.levels[i] = lv
	}
	return s, nil
}

// writeArgs returns write.lua's arguments for rules holding levels at now,
// refused from server time deadline: the key's TTL in ms, the deadline,
// then field, value pairs ("" deletes the field). The two numbers go by
// pointer into one allocation: boxing would take two.
func writeArgs(rules []rule, levels []level, now, deadline int64) []any {
	head := &[2]int64{0, deadline}
	args := make([]any, 2, 2+2*len(rules))
	args[0], args[1] = &head[0], &head[1]
	var ttl int64
	for i, r := range rules {
		lv := levels[i]
		if lv.fill == 0 {
			args = append(args, r.arg, emptyArg)
			continue
		}
		empty := satAdd(lv.at, r.waitIn(lv, r.full/r.per))
		if r.grid == 0 { // a window or a calendar rule (lv.at >= now)
			ttl = max(ttl, ceilDiv(empty-now, 1000))
		} else { // PEXPIRE runs at or after now: the key lives to expiryOf
			ttl = max(ttl, r.expiryOf(empty)-now/1000)
		}
		args = append(args, r.arg, r.encode(lv))
	}
	head[0] = min(ttl, maxTTL)
	return args
}

// emptyArg deletes a rule's field (boxed once).
var emptyArg any = ""

// maxTTL is the longest state TTL written, in ms: the longest a client can
// hold as a time.Duration (miniredis wraps past it).
const maxTTL = math.MaxInt64 / int64(time.Millisecond)

// maxGridLog bounds a rule's grid: 2^32 ms, 50 days. A fresh value's TTL is
// at most maxFreshTTL, so rounded up to a grid it is at most maxTTL.
const (
	maxGridLog  = 32
	maxFreshTTL = maxTTL - 1<<maxGridLog - 1
)
