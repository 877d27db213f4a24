package guard_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/funnelguard/funnelguard/guard"
)

// keyCase is a request and the key a KeyFunc should give: want, or an
// error matching err.
type keyCase struct {
	name string
	r    *http.Request
	want string
	err  error
}

func runKeyCases(t *testing.T, key guard.KeyFunc, cases []keyCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := key(tc.r)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("key = %q, %v; want an error matching %v", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("key = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// get is a GET of target with the header lines hdr (name, value, ...).
func get(target string, hdr ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, target, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	return r
}

func TestHeader(t *testing.T) {
	runKeyCases(t, guard.Header("x-api-key"), []keyCase{
		{name: "value", r: get("/", "X-Api-Key", "k1"), want: "k1"},
		{name: "trimmed", r: get("/", "X-Api-Key", " \tk1 "), want: "k1"},
		{name: "inner space kept", r: get("/", "X-Api-Key", "k 1"), want: "k 1"},
		{name: "missing", r: get("/", "X-Other", "k1"), err: guard.ErrNoKey},
		{name: "empty", r: get("/", "X-Api-Key", ""), err: guard.ErrNoKey},
		{name: "blank", r: get("/", "X-Api-Key", "  "), err: guard.ErrNoKey},
		{name: "two lines", r: get("/", "X-Api-Key", "k1", "X-Api-Key", "k2"), err: guard.ErrNoKey},
	})
	runKeyCases(t, guard.Header("host"), []keyCase{
		{name: "Host", r: get("http://api.example/"), want: "api.example"},
	})
}

func TestQuery(t *testing.T) {
	runKeyCases(t, guard.Query("phone"), []keyCase{
		{name: "value", r: get("/send?phone=%2B8613800138000"), want: "+8613800138000"},
		{name: "plus is a space", r: get("/send?phone=+8613800138000"), want: " 8613800138000"},
		{name: "missing", r: get("/send?country=CN"), err: guard.ErrNoKey},
		{name: "no query", r: get("/send"), err: guard.ErrNoKey},
		{name: "empty", r: get("/send?phone="), err: guard.ErrNoKey},
		{name: "twice", r: get("/send?phone=1&phone=2"), err: guard.ErrNoKey},
		{name: "malformed", r: get("/send?phone=1&x=%zz"), err: guard.ErrNoKey},
		{name: "semicolon", r: get("/send?phone=1;x=2"), err: guard.ErrNoKey},
	})
}

// routed is the request that a handler registered under pattern in a
// ServeMux sees, r.Pattern set.
func routed(pattern, method, target string) *http.Request {
	var seen *http.Request
	mux := http.NewServeMux()
	mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) { seen = r })
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, target, nil))
	return seen
}

func TestRoute(t *testing.T) {
	runKeyCases(t, guard.Route, []keyCase{
		{name: "pattern", r: routed("POST /users/{id}/send", http.MethodPost, "/users/42/send"), want: "POST /users/{id}/send"},
		{name: "pattern, other id", r: routed("POST /users/{id}/send", http.MethodPost, "/users/43/send"), want: "POST /users/{id}/send"},
		{name: "pattern's method", r: routed("GET\t /items/", http.MethodHead, "/items/a/b"), want: "GET /items/"},
		{name: "pattern without method", r: routed("/any", http.MethodPut, "/any"), want: "PUT /any"},
		{name: "host in pattern", r: routed("api.example/any", http.MethodPut, "http://api.example/any"), want: "PUT api.example/any"},
		{name: "no pattern: the path", r: httptest.NewRequest(http.MethodPost, "/users/42/send?x=1", nil), want: "POST /users/42/send"},
	})
}

func TestJoin(t *testing.T) {
	fixed := func(k string) guard.KeyFunc {
		return func(*http.Request) (string, error) { return k, nil }
	}
	r := get("/")
	keys := map[string][]string{}
	for _, parts := range [][]string{
		{"a", "b"}, {"a|b"}, {"a|", "b"}, {"a", "|b"}, {"a\\", "b"}, {"a\\|b"}, {"a", "", "b"}, {"a|", "|b"}, {"", ""}, {""}, {"\\"}, {"\\\\"}, {"|"},
	} {
		var fs []guard.KeyFunc
		for _, p := range parts {
			fs = append(fs, fixed(p))
		}
		k, err := guard.Join(fs...)(r)
		if err != nil {
			t.Fatal(err)
		}
		if prev, ok := keys[k]; ok {
			t.Fatalf("Join(%q) = Join(%q) = %q", parts, prev, k)
		}
		keys[k] = parts
	}
	if k, _ := guard.Join(fixed("POST /send"), fixed("203.0.113.7"))(r); k != "POST /send|203.0.113.7" {
		t.Fatalf("Join = %q", k)
	}

	calls := 0
	failing := func(*http.Request) (string, error) { calls++; return "", guard.ErrNoKey }
	after := func(*http.Request) (string, error) { calls += 10; return "x", nil }
	if _, err := guard.Join(fixed("a"), failing, after)(r); !errors.Is(err, guard.ErrNoKey) || calls != 1 {
		t.Fatalf("Join with a failing part: %v, %d calls; want ErrNoKey, the parts after it not called", err, calls)
	}

	r0 := httptest.NewRequest(http.MethodPost, "/", nil)
	for name, f := range map[string]guard.KeyFunc{
		"no parts": guard.Join(),
		"nil part": guard.Join(fixed("a"), nil),
	} {
		if k, err := f(r0); !errors.Is(err, guard.ErrInvalidKeyFunc) || k != "" {
			t.Errorf("Join with %s: %q, %v; want ErrInvalidKeyFunc", name, k, err)
		}
	}
}

func TestBodyKeyFuncsWithoutLimit(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"phone":"1"}`))
	r.Header.Set("Content-Type", "application/json")
	for name, f := range map[string]guard.KeyFunc{
		"JSONField": guard.JSONField("phone", 0),
		"FormField": guard.FormField("phone", -1),
	} {
		if k, err := f(r); !errors.Is(err, guard.ErrInvalidKeyFunc) || k != "" {
			t.Errorf("%s without a limit: %q, %v; want ErrInvalidKeyFunc", name, k, err)
		}
	}
}
