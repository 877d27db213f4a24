package keyspace

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// clusterSlot is the Redis Cluster hash slot of key, by the cluster
// specification: CRC16 (XMODEM) modulo 16384 of the hash tag, which is the
// content of the first {...} section when that content is not empty, and the
// whole key otherwise.
func clusterSlot(key string) (slot uint16, tag string, tagged bool) {
	tag = key
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			tag, tagged = key[s+1:s+1+e], true
		}
	}
	return crc16(tag) % 16384, tag, tagged
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), as in the
// Redis Cluster specification.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// TestFuzzKeyClusterSlotReference pins the test's slot function to values from the
// cluster specification and CLUSTER KEYSLOT.
func TestFuzzKeyClusterSlotReference(t *testing.T) {
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3 (the spec's test vector)", got)
	}
	for key, want := range map[string]uint16{
		"foo": 12182, "bar": 5061, "{foo}:lock": 12182, "a{foo}b{bar}": 12182,
		"{}foo": crc16("{}foo") % 16384, "foo{}{bar}": crc16("foo{}{bar}") % 16384, "}{foo}": 12182,
	} {
		if got, _, _ := clusterSlot(key); got != want {
			t.Errorf("slot(%q) = %d, want %d", key, got, want)
		}
	}
}

// unescape inverts the tag escape: "~0" '~', "~1" '{', "~2" '}', and the
// lone "~" of the empty name. ok is false for a tag Key cannot produce.
func unescape(tag string) (name string, ok bool) {
	if tag == "~" {
		return "", true
	}
	var b strings.Builder
	for i := 0; i < len(tag); i++ {
		c := tag[i]
		switch {
		case c == '{' || c == '}':
			return "", false
		case c != '~':
			b.WriteByte(c)
		case i+1 < len(tag) && tag[i+1] >= '0' && tag[i+1] <= '2':
			b.WriteByte("~{}"[tag[i+1]-'0'])
			i++
		default:
			return "", false
		}
	}
	return b.String(), tag != ""
}

// parse splits a key built by Key back into its prefix, name and kind: the
// prefix ends at the first '{' (a prefix holds none), the tag at the next
// '}' (an escaped name holds none), and "}:" precedes the kind. Key is
// injective exactly when parse inverts it.
func parse(key string) (prefix, name, kind string, ok bool) {
	s := strings.IndexByte(key, '{')
	if s < 0 {
		return "", "", "", false
	}
	e := strings.IndexByte(key[s+1:], '}')
	if e < 0 || !strings.HasPrefix(key[s+1+e:], "}:") {
		return "", "", "", false
	}
	name, ok = unescape(key[s+1 : s+1+e])
	return key[:s], name, key[s+1+e+2:], ok
}

// validPrefix turns any string into a prefix CheckPrefix accepts, so that no
// fuzz input is wasted.
func validPrefix(p string) string {
	p = strings.NewReplacer("{", "", "}", "").Replace(p)
	if len(p) > MaxPrefix {
		p = p[:MaxPrefix]
	}
	return p
}

// keyProps checks key, a Key-like function, on one fuzz input: the prefix
// is kept; the key parses back to (prefix, name, kind), so two different
// names or kinds never share a key; every kind of a name has the same Redis
// Cluster slot through a hash tag that is never empty (else the whole key,
// kind included, would be hashed); and two different names have different
// tags. It returns the first property that fails.
func keyProps(key func(prefix, name, kind string) string, prefix, a, b, kind string) error {
	for _, name := range []string{a, b} {
		for _, k := range []string{"lock", "state", kind} {
			full := key(prefix, name, k)
			if !strings.HasPrefix(full, prefix+"{") {
				return fmt.Errorf("key(%q, %q, %q) = %q lost the prefix", prefix, name, k, full)
			}
			p, n, kd, ok := parse(full)
			if !ok || p != prefix || n != name || kd != k {
				return fmt.Errorf("key(%q, %q, %q) = %q parses back to (%q, %q, %q, %v): not injective", prefix, name, k, full, p, n, kd, ok)
			}
		}
		lock := key(prefix, name, "lock")
		ls, ltag, tagged := clusterSlot(lock)
		if !tagged {
			return fmt.Errorf("name %q: key %q has no non-empty hash tag: the whole key is hashed", name, lock)
		}
		if utf8.ValidString(name) && !utf8.ValidString(ltag) {
			return fmt.Errorf("name %q: the tag %q of a valid UTF-8 name is not valid UTF-8", name, ltag)
		}
		for _, k := range []string{"state", kind} {
			if s, tag, _ := clusterSlot(key(prefix, name, k)); s != ls || tag != ltag {
				return fmt.Errorf("name %q: %q (slot %d, tag %q) and kind %q (slot %d, tag %q) differ", name, lock, ls, ltag, k, s, tag)
			}
		}
	}
	if a != b {
		_, ta, _ := clusterSlot(key(prefix, a, "lock"))
		_, tb, _ := clusterSlot(key(prefix, b, "lock"))
		if ta == tb {
			return fmt.Errorf("names %q and %q share the hash tag %q", a, b, ta)
		}
	}
	return nil
}

// FuzzKey checks keyProps of Key for arbitrary prefixes (made valid: any
// prefix CheckPrefix accepts), names and kinds, and that CheckPrefix refuses
// every prefix with a brace or over MaxPrefix bytes.
//
//	go test -run '^$' -fuzz FuzzKey -fuzztime 30s -fuzzminimizetime 2s ./internal/keyspace/
func FuzzKey(f *testing.F) {
	seeds := []string{"", "a", "order:42", "~", "~0", "~1", "~2", "~~", "~{", "{", "}", "{}", "}{", "{{", "}}",
		"a{b}c", "{a}{b}", "a:lock", "lock", "*?[]", "a\x00b", "\r\n", "\xff\xfe", "+8613800138000"}
	for i, a := range seeds {
		b := seeds[(i+1)%len(seeds)]
		f.Add("fg:", a, b, "lock")
		f.Add("p}{:", a, b+"}", "{state}")
	}
	f.Fuzz(func(t *testing.T, rawPrefix, a, b, kind string) {
		if (strings.ContainsAny(rawPrefix, "{}") || len(rawPrefix) > MaxPrefix) && CheckPrefix(rawPrefix) == nil {
			t.Fatalf("CheckPrefix(%q) accepted a prefix that breaks the hash tag", rawPrefix)
		}
		prefix := validPrefix(rawPrefix)
		if err := CheckPrefix(prefix); err != nil {
			t.Fatalf("CheckPrefix(%q) = %v for a prefix without braces, at most %d bytes", prefix, err, MaxPrefix)
		}
		if err := keyProps(Key, prefix, a, b, kind); err != nil {
			t.Fatal(err)
		}
		// A name that reads like another name's key of a kind ("a:lock")
		// is data: it never gives that key.
		if Key(prefix, a+":"+kind, "lock") == Key(prefix, a, kind) {
			t.Fatalf("name %q, kind lock, collides with name %q, kind %q", a+":"+kind, a, kind)
		}
	})
}

// TestFuzzKeyPropsCatchNaiveKeys shows that keyProps is not vacuous: keys
// built without the escape fail it on the inputs that break them.
func TestFuzzKeyPropsCatchNaiveKeys(t *testing.T) {
	naive := func(prefix, name, kind string) string { return prefix + "{" + name + "}:" + kind }
	noEmptyTag := func(prefix, name, kind string) string {
		if name == "" {
			return prefix + "{}:" + kind
		}
		return Key(prefix, name, kind)
	}
	for _, tc := range []struct {
		key     func(prefix, name, kind string) string
		a, b, k string
	}{
		{naive, "}{", "x", "lock"},   // empty tag: lock and state in different slots
		{naive, "a}b", "a", "lock"},  // tag "a" shared by two names
		{naive, "{x}", "x", "state"}, // does not parse back
		{noEmptyTag, "", "x", "lock"},
	} {
		if err := keyProps(tc.key, "p:", tc.a, tc.b, tc.k); err == nil {
			t.Errorf("keyProps accepted a broken key function on (%q, %q, %q)", tc.a, tc.b, tc.k)
		}
	}
	if err := keyProps(Key, "p:", "}{", "a}b", "lock"); err != nil {
		t.Errorf("keyProps rejects Key: %v", err)
	}
}
