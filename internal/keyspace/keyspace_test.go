package keyspace

import (
	"errors"
	"strings"
	"testing"
)

// hashTag is the part of key that Redis Cluster hashes (the cluster spec's rule).
func hashTag(key string) string {
	s := strings.IndexByte(key, '{')
	if s < 0 {
		return key
	}
	e := strings.IndexByte(key[s+1:], '}')
	if e <= 0 {
		return key
	}
	return key[s+1 : s+1+e]
}

func TestKeySameSlotForEveryKind(t *testing.T) {
	names := []string{"order:42", "", "{", "}", "{}", "}{", "a{b}c", "~", "~1", "{x}", "*?[]", "a\x00b", "\r\n", "+8613800138000"}
	for _, name := range names {
		lock, state := Key("fg:", name, "lock"), Key("fg:", name, "funnel")
		if hashTag(lock) != hashTag(state) {
			t.Errorf("name %q: lock key %q and state key %q hash different tags %q, %q", name, lock, state, hashTag(lock), hashTag(state))
		}
		if hashTag(lock) == lock {
			t.Errorf("name %q: key %q has no hash tag, the whole key would be hashed", name, lock)
		}
	}
}

func TestKeyInjective(t *testing.T) {
	names := []string{"", "a", "~", "~0", "~1", "~2", "{", "}", "{}", "}{", "~~", "~{", "a{b}c", "a~1b~2c"}
	seen := map[string]string{}
	for _, name := range names {
		k := Key("p:", name, "lock")
		if other, ok := seen[k]; ok {
			t.Fatalf("names %q and %q share key %q", other, name, k)
		}
		seen[k] = name
	}
}

func TestKeyPlainNameReadable(t *testing.T) {
	if got, want := Key("fg:", "order:42", "lock"), "fg:{order:42}:lock"; got != want {
		t.Fatalf("Key = %q, want %q", got, want)
	}
}

func TestCheckPrefix(t *testing.T) {
	for _, p := range []string{"{", "}", "a{b", strings.Repeat("x", MaxPrefix+1)} {
		if err := CheckPrefix(p); !errors.Is(err, ErrPrefix) {
			t.Errorf("CheckPrefix(%.20q) = %v, want ErrPrefix", p, err)
		}
	}
	for _, p := range []string{"", "fg:", "sms:phone:"} {
		if err := CheckPrefix(p); err != nil {
			t.Errorf("CheckPrefix(%q) = %v, want nil", p, err)
		}
	}
}
