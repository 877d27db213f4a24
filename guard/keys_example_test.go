package guard_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/redis/go-redis/v9"
)

// A JSON API limited per phone number: the handler still decodes the whole
// body.
func ExampleKeyFunc() {
	m, _ := miniredis.Run()
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	g, _ := guard.New(client, guard.WithPrefix("sms:phone:"), guard.WithRules(funnel.AtMost(1, time.Minute)))

	sendCode := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Println("handler reads", string(body))
		w.WriteHeader(http.StatusAccepted)
	})
	h := g.Middleware(guard.JSONField("phone", 4<<10))(sendCode)
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/send", strings.NewReader(`{"phone":"+8613800138000"}`))
		r.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		fmt.Println(rec.Code)
	}
	// Output:
	// handler reads {"phone":"+8613800138000"}
	// 202
	// 429
}

// Behind proxies in 10.0.0.0/8, the client is the rightmost address in
// X-Forwarded-For that is not theirs; whatever the client wrote to its left
// is ignored, and so is the header of a client that connects directly.
func ExampleClientIP() {
	key := guard.ClientIP(netip.MustParsePrefix("10.0.0.0/8"))
	for _, req := range []struct{ peer, xff string }{
		{"203.0.113.7:4711", "198.51.100.1"},                         // direct, spoofing
		{"10.0.0.1:80", "198.51.100.1, 203.0.113.7"},                 // via a proxy, spoofing
		{"10.0.0.1:80", "203.0.113.7, 10.0.0.2"},                     // via two proxies
		{"10.0.0.1:80", "[2001:db8:1:2::99]:4711"},                   // IPv6: its /64
		{"[2001:db8:1:2:ffff::1]:4711", ""},                          // the same /64
		{"[::ffff:203.0.113.7]:4711", ""},                            // IPv4-mapped
		{"10.0.0.1:80", "203.0.113.7, not-an-address, 10.0.0.2"},     // the chain breaks
		{"10.0.0.1:80", "198.51.100.1, 203.0.113.7, not-an-address"}, // at the proxy
	} {
		r := httptest.NewRequest(http.MethodPost, "/send", nil)
		r.RemoteAddr = req.peer
		if req.xff != "" {
			r.Header.Set("X-Forwarded-For", req.xff)
		}
		k, _ := key(r)
		fmt.Println(k)
	}
	// Output:
	// 203.0.113.7
	// 203.0.113.7
	// 203.0.113.7
	// 2001:db8:1:2::/64
	// 2001:db8:1:2::/64
	// 203.0.113.7
	// 10.0.0.2
	// 10.0.0.1
}

// One load balancer whose address is not known in advance, writing RFC
// 7239 Forwarded; IPv6 clients grouped by /56.
func ExampleClientIPConfig() {
	ip := guard.ClientIPConfig{TrustedHops: 1, Header: "Forwarded", IPv6PrefixLen: 56}
	r := httptest.NewRequest(http.MethodPost, "/send", nil)
	r.RemoteAddr = "192.0.2.10:80"
	r.Header.Set("Forwarded", `for=198.51.100.1, for="[2001:db8:cafe:17::1]:4711";proto=https`)
	k, _ := ip.Key(r)
	fmt.Println(k)
	// Output:
	// 2001:db8:cafe::/56
}

func ExampleClientIPConfig_Addr() {
	ip := guard.ClientIPConfig{TrustedHops: 1}
	r := httptest.NewRequest(http.MethodPost, "/send", nil)
	r.RemoteAddr = "192.0.2.10:80"
	r.Header.Set("X-Forwarded-For", "[2001:db8:1:2::99]:4711")
	a, _ := ip.Addr(r)
	k, _ := ip.Key(r)
	fmt.Println(a, k)
	// Output:
	// 2001:db8:1:2::99 2001:db8:1:2::/64
}

func ExampleClientIPConfig_Key() {
	ip := guard.ClientIPConfig{IPv6PrefixLen: 128}
	r := httptest.NewRequest(http.MethodPost, "/send", nil)
	r.RemoteAddr = "[2001:db8:1:2::99]:4711"
	k, _ := ip.Key(r)
	fmt.Println(k)
	r.RemoteAddr = "@" // a Unix socket
	_, err := ip.Key(r)
	fmt.Println(errors.Is(err, guard.ErrNoKey))
	// Output:
	// 2001:db8:1:2::99/128
	// true
}

func ExampleHeader() {
	key := guard.Header("X-API-Key")
	r := httptest.NewRequest(http.MethodGet, "/items", nil)
	r.Header.Set("X-API-Key", " k-123 ")
	fmt.Println(key(r))
	r.Header.Del("X-API-Key")
	_, err := key(r)
	fmt.Println(errors.Is(err, guard.ErrNoKey))
	// Output:
	// k-123 <nil>
	// true
}

func ExampleQuery() {
	key := guard.Query("phone")
	for _, target := range []string{"/send?phone=%2B8613800138000", "/send?phone=+8613800138000", "/send?phone=1&phone=2"} {
		k, err := key(httptest.NewRequest(http.MethodGet, target, nil))
		fmt.Printf("%q %v\n", k, errors.Is(err, guard.ErrNoKey))
	}
	// Output:
	// "+8613800138000" false
	// " 8613800138000" false
	// "" true
}

// The key comes from the body, and the handler reads the same body.
func ExampleJSONField() {
	key := guard.JSONField("phone", 4<<10)
	for _, req := range []struct{ contentType, body string }{
		{"application/json", `{"phone": "+8613800138000", "country": "CN"}`},
		{"application/json", `{"country": "CN"}`},
		{"text/plain", `{"phone": "+8613800138000"}`},
		{"application/json", `{"phone": "+8613800138000", "pad": "` + strings.Repeat("x", 5000) + `"}`},
	} {
		r := httptest.NewRequest(http.MethodPost, "/send", strings.NewReader(req.body))
		r.Header.Set("Content-Type", req.contentType)
		k, err := key(r)
		body, _ := io.ReadAll(r.Body) // what the handler reads
		fmt.Printf("%q no key: %v, not JSON: %v, too large: %v, body intact: %v\n", k,
			errors.Is(err, guard.ErrNoKey), errors.Is(err, guard.ErrContentType), errors.Is(err, guard.ErrBodyTooLarge), string(body) == req.body)
	}
	// Output:
	// "+8613800138000" no key: false, not JSON: false, too large: false, body intact: true
	// "" no key: true, not JSON: false, too large: false, body intact: true
	// "" no key: false, not JSON: true, too large: false, body intact: true
	// "" no key: false, not JSON: false, too large: true, body intact: true
}

// In a form, '+' is a space: a client sends a plus as %2B (curl
// --data-urlencode phone=+86..., not curl -d phone=+86...).
func ExampleFormField() {
	key := guard.FormField("phone", 4<<10)
	for _, body := range []string{"phone=%2B8613800138000", "phone=+8613800138000"} {
		r := httptest.NewRequest(http.MethodPost, "/send?phone=ignored", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		k, _ := key(r)
		fmt.Printf("%q, and the handler's PostFormValue: %q\n", k, r.PostFormValue("phone"))
	}
	// Output:
	// "+8613800138000", and the handler's PostFormValue: "+8613800138000"
	// " 8613800138000", and the handler's PostFormValue: " 8613800138000"
}

// Route keys on the ServeMux pattern, so every user id shares one key.
func ExampleRoute() {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /users/{id}/send", func(w http.ResponseWriter, r *http.Request) {
		k, _ := guard.Route(r)
		fmt.Println(k)
	})
	for _, id := range []string{"42", "43"} {
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/users/"+id+"/send", nil))
	}
	// Output:
	// POST /users/{id}/send
	// POST /users/{id}/send
}

// A limit per route and client address.
func ExampleJoin() {
	key := guard.Join(guard.Route, guard.ClientIP())
	r := httptest.NewRequest(http.MethodPost, "/send", nil)
	r.RemoteAddr = "203.0.113.7:4711"
	fmt.Println(key(r))
	// Output:
	// POST /send|203.0.113.7 <nil>
}
