package phonekey_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/guard/phonekey"
	"github.com/redis/go-redis/v9"
)

func ExampleNormalize() {
	for _, raw := range []string{"+86 136 0000 0009", "0086-136-0000-0009", "13600000009", "+86 1"} {
		key, err := phonekey.Normalize(raw, "CN")
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(key)
	}
	// Output:
	// +8613600000009
	// +8613600000009
	// +8613600000009
	// phonekey: invalid phone number: too few digits; write it as + and the country code, then the number, or as a national number of CN
}

// Every spelling of one number is one key: the second request, written
// otherwise, is inside the first one's one-minute cooldown.
func ExampleJSONField() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	g, err := guard.New(client,
		guard.WithPrefix("sms:phone:"),
		guard.WithRules(funnel.AtMost(1, time.Minute), funnel.Window(5, time.Hour), funnel.Window(10, 24*time.Hour)),
	)
	if err != nil {
		panic(err)
	}
	sendCode := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) })
	h := g.Middleware(phonekey.JSONField("phone", "CN", 4<<10))(sendCode)

	for _, body := range []string{`{"phone":"+8613600000009"}`, `{"phone":"+86 136 0000 0009"}`, `{"phone":"136 0000"}`} {
		r := httptest.NewRequest(http.MethodPost, "/send", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(strings.TrimSpace(fmt.Sprint(w.Code, " ", w.Body.String())))
	}
	// Output:
	// 202
	// 429 {"error":"too many requests","retry_after":60}
	// 400 {"error":"invalid phone number: no number of +86 starts with these digits or has this many; write it as + and the country code, then the number, or as a national number of CN"}
}
