package nilcheck

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestIsNil(t *testing.T) {
	var c *redis.Client
	var s redis.Scripter = c
	for _, v := range []any{nil, c, s, (map[string]int)(nil), (func())(nil)} {
		if !IsNil(v) {
			t.Errorf("IsNil(%#v) = false", v)
		}
	}
	live := redis.NewClient(&redis.Options{})
	defer live.Close()
	for _, v := range []any{live, 0, "", struct{}{}} {
		if IsNil(v) {
			t.Errorf("IsNil(%#v) = true", v)
		}
	}
}
