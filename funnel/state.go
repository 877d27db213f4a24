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

// encode returns the stored value of a rule whose funnel holds fill at
// server time at.
func (r rule) encode(fill, at int64) string {
	b := make([]byte, 0, 32)
	b = strconv.AppendInt(b, r.wait(fill, 1), 36)
	b = append(b, ':')
	b = strconv.AppendInt(b, fill, 36)
	b = append(b, ':')
	b = strconv.AppendInt(b, at, 36)
	return string(b)
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
	lv, ok := parseLevel(s)
	if !ok || lv.fill > r.full {
		return level{}, fmt.Errorf("%w: field %q holds %q", ErrCorruptState, r.id, s)
	}
	return lv, nil
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
// server times ats, written at now: the key's TTL in ms (until every funnel
// is empty), then field, value pairs; an empty funnel's value is "" (its
// field is deleted).
func writeArgs(rules []rule, fills, ats []int64, now int64) []any {
	args := make([]any, 1, 1+2*len(rules))
	var ttl int64
	for i, r := range rules {
		if fills[i] == 0 {
			args = append(args, r.arg, emptyArg)
			continue
		}
		empty := satAdd(ats[i]-now, ceilDiv(fills[i], r.leak)) // µs from now
		ttl = max(ttl, ceilDiv(empty, 1000))
		args = append(args, r.arg, r.encode(fills[i], ats[i]))
	}
	args[0] = min(ttl, maxTTL)
	return args
}

// emptyArg deletes a rule's field (boxed once).
var emptyArg any = ""

// maxTTL is the longest state TTL written, in ms: the largest that a client
// can hold as a time.Duration (about 292 years; miniredis, for one, wraps
// past it and deletes the key at once). A key whose funnels need longer to
// drain forgets their levels 292 years after its last write.
const maxTTL = math.MaxInt64 / int64(time.Millisecond)
