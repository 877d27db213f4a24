package main

import (
	"context"
	_ "embed"
	"encoding/base64"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The index of paused prefixes. A pause lives under keys named by its
// prefix's HMAC (conversion.go), in the prefix's hash slot, so nothing
// lists them but a SCAN of the whole key space (of every node of a
// Cluster), whose cost grows with all the service's keys, numbers and
// codes included. Instead the send that pauses a prefix adds its id to one
// sorted set (its key
// ends in an HMAC, see indexKey), scored by when the pause ends: bounded (maxPausesIndexed,
// ended pauses leave it on each add and each listing) and expiring with
// its last pause. It is kept beside the pause, not by conversion.lua: a
// script may only touch keys of one hash slot.

var (
	//go:embed pauseindex.lua
	pauseIndexSrc    string
	pauseIndexScript = redis.NewScript(pauseIndexSrc)
)

// indexKey is the index: a sorted set of the ids of paused prefixes. Its
// name ends in an HMAC, as every key of the service does: services with
// secrets of their own on one Redis keep indexes of their own.
func (c *conversionGuard) indexKey() string {
	return "sms:conv:paused:" + base64.RawURLEncoding.EncodeToString(c.mac("conversion paused index"))
}

// maxPausesIndexed bounds the index: it keeps the pauses that end last.
// A pause takes -conversion-sends sends to its prefix, so even the whole of
// a large daily budget makes fewer.
const maxPausesIndexed = 1000

// indexPause adds dest's prefix, just paused for wait, to the index. A
// failure is logged: the pause holds all the same, it is only not listed.
func (c *conversionGuard) indexPause(ctx context.Context, dest destination, wait time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	err := pauseIndexScript.Run(ctx, c.client, []string{c.indexKey()}, c.id(dest.Prefix), wait.Microseconds(), maxPausesIndexed).Err()
	if err != nil {
		c.metrics.redisErrors.Inc()
		c.log.Warn("indexing a paused prefix failed", "prefix", shownPrefix(dest), "err", err)
	}
}

// pausedPrefix is a paused prefix as the operators' tools show it: the
// figures it was paused for (of the last sends judged, how many codes were
// verified), when the pause ends, and the id that resumes it.
type pausedPrefix struct {
	ID       string    `json:"id"`
	Prefix   string    `json:"prefix"`
	Verified int64     `json:"verified"`
	Judged   int64     `json:"judged"`
	Until    time.Time `json:"until"`
	Left     int64     `json:"left"` // seconds
}

// paused lists the paused prefixes, the first to end first, and takes the
// ended ones out of the index.
func (c *conversionGuard) paused(ctx context.Context) ([]pausedPrefix, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	ids, err := c.client.ZRange(ctx, c.indexKey(), 0, -1).Result()
	if err != nil {
		return nil, err
	}
	fields := make([]*redis.SliceCmd, len(ids))
	ttls := make([]*redis.DurationCmd, len(ids))
	_, err = c.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			pause := conversionKeys(id)[2]
			fields[i] = p.HMGet(ctx, pause, "until", "prefix", "verified", "judged")
			ttls[i] = p.PTTL(ctx, pause)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out, ended := []pausedPrefix{}, []any{}
	for i, id := range ids {
		v, left := fields[i].Val(), ttls[i].Val()
		if left <= 0 || len(v) < 4 || v[0] == nil {
			ended = append(ended, id)
			continue
		}
		out = append(out, pausedPrefix{ID: id, Prefix: str(v[1]), Verified: num(v[2]), Judged: num(v[3]),
			Until: time.UnixMicro(num(v[0])).UTC(), Left: *seconds(left)})
	}
	if len(ended) > 0 {
		err = c.client.ZRem(ctx, c.indexKey(), ended...).Err()
	}
	return out, err
}

// pauseLeft returns how long the pause of prefix lasts yet; 0 if it is not
// paused.
func (c *conversionGuard) pauseLeft(ctx context.Context, prefix string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	left, err := c.client.PTTL(ctx, c.keys(prefix)[2]).Result()
	return max(left, 0), err
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func num(v any) int64 {
	n, _ := strconv.ParseInt(str(v), 10, 64)
	return n
}
