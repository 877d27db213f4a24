package guard_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// sent is in every bad request below, where the client wrote it: no answer
// may quote it.
const sent = "4155550199"

// badRequest is a request Middleware cannot decide on, and its answer.
type badRequest struct {
	name   string
	key    guard.KeyFunc
	opts   []guard.MiddlewareOption
	r      *http.Request
	status int
	body   string // the "error" of the JSON body
}

// post is a POST of body declared as ct ("" for no Content-Type).
func post(ct, body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/send", strings.NewReader(body))
	if ct != "" {
		r.Header.Set("Content-Type", ct)
	}
	return r
}

// badRequests are fresh requests of every kind Middleware answers with 4xx.
func badRequests() []badRequest {
	const js, form = "application/json", "application/x-www-form-urlencoded"
	phone := guard.JSONField("phone", 64)
	formPhone := guard.FormField("phone", 64)
	apiKey := guard.Header("X-Api-Key")
	noBody := httptest.NewRequest(http.MethodPost, "/send", nil)
	noBody.Header.Set("Content-Type", js)
	noBody.Header.Set("X-Phone", sent)
	unreadable := post(js, "")
	unreadable.ContentLength = -1
	unreadable.Body = io.NopCloser(io.MultiReader(strings.NewReader(`{"phone":"`+sent), &failing{errors.New("connection reset")}))
	noAddr := get("/send?phone=" + sent)
	noAddr.RemoteAddr = "@"
	fixed := func(*http.Request) (string, error) {
		return "", &guard.RequestError{Fix: "sign in first", Err: fmt.Errorf("no session for %s", sent)}
	}
	plain := func(*http.Request) (string, error) { return "", fmt.Errorf("no user %q", sent) }
	long := func(*http.Request) (string, error) { return strings.Repeat(sent, guard.MaxKeyLen), nil }
	ok := func(*http.Request) (string, error) { return "k", nil }
	costErr := guard.WithCost(func(*http.Request) (int64, error) { return 0, fmt.Errorf("bad count %q", sent) })
	costBig := guard.WithCost(func(*http.Request) (int64, error) { return 4, nil }) // the rule holds 3
	return []badRequest{
		{"JSON: field missing", phone, nil, post(js, `{"to":"`+sent+`"}`), 400, `missing field "phone"`},
		{"JSON: field in another case", phone, nil, post(js, `{"Phone":"`+sent+`"}`), 400, `missing field "phone" (names are case-sensitive)`},
		{"JSON: field twice", phone, nil, post(js, `{"phone":"`+sent+`","phone":"1"}`), 400, `field "phone" given more than once`},
		{"JSON: field empty", phone, nil, post(js, `{"phone":"","to":"`+sent+`"}`), 400, `empty field "phone"`},
		{"JSON: field of another type", phone, nil, post(js, `{"phone":["`+sent+`"]}`), 400, `field "phone" must be a string or a number`},
		{"JSON: field a fraction", phone, nil, post(js, `{"phone":`+sent+`.5}`), 400, `field "phone" must be an integer, without a fraction or an exponent`},
		{"JSON: not an object", phone, nil, post(js, `["`+sent+`"]`), 400, `the body must be a JSON object`},
		{"JSON: malformed", phone, nil, post(js, `{"phone":`+sent), 400, `the body must be a JSON object`},
		{"JSON: no body", phone, nil, noBody, 400, `missing request body`},
		{"JSON: unreadable body", phone, nil, unreadable, 400, `the request body could not be read`},
		{"JSON: declared as text", phone, nil, post("text/plain", `{"phone":"`+sent+`"}`), 415, `the body must be declared as Content-Type: application/json`},
		{"JSON: too large", phone, nil, post(js, `{"phone":"`+sent+`","pad":"`+strings.Repeat(sent, 8)+`"}`), 413, `the body must be at most 64 bytes`},
		{"form: field missing", formPhone, nil, post(form, "to="+sent), 400, `missing form field "phone"`},
		{"form: field twice", formPhone, nil, post(form, "phone="+sent+"&phone=1"), 400, `form field "phone" given more than once`},
		{"form: field empty", formPhone, nil, post(form, "phone=&to="+sent), 400, `empty form field "phone"`},
		{"form: malformed", formPhone, nil, post(form, "phone="+sent+"%zz"), 400, `malformed form body`},
		{"form: GET", formPhone, nil, get("/send?phone=" + sent), 400, `a form must be sent with POST, PUT or PATCH`},
		{"form: declared as JSON", formPhone, nil, post(js, "phone="+sent), 415, `the body must be declared as Content-Type: application/x-www-form-urlencoded or multipart/form-data`},
		{"header missing", apiKey, nil, get("/send", "X-Api-Kee", sent), 400, `missing header X-Api-Key`},
		{"header twice", apiKey, nil, get("/send", "X-Api-Key", sent, "X-Api-Key", "k"), 400, `header X-Api-Key given more than once`},
		{"header empty", apiKey, nil, get("/send?k="+sent, "X-Api-Key", " "), 400, `empty header X-Api-Key`},
		{"header missing, joined", guard.Join(guard.Route, apiKey), nil, get("/send?k=" + sent), 400, `missing header X-Api-Key`},
		{"query parameter missing", guard.Query("to"), nil, get("/send?phone=" + sent), 400, `missing query parameter "to"`},
		{"query parameter twice", guard.Query("to"), nil, get("/send?to=" + sent + "&to=1"), 400, `query parameter "to" given more than once`},
		{"query parameter empty", guard.Query("to"), nil, get("/send?to=&k=" + sent), 400, `empty query parameter "to"`},
		{"query malformed", guard.Query("to"), nil, get("/send?to=" + sent + "%zz"), 400, `malformed query string`},
		{"no client address", guard.ClientIP(), nil, noAddr, 400, `the client's address is unknown`},
		{"a KeyFunc's RequestError", fixed, nil, get("/send?k=" + sent), 400, `sign in first`},
		{"a KeyFunc's plain error", plain, nil, get("/send?k=" + sent), 400, `invalid request key`},
		{"a key over MaxKeyLen", long, nil, get("/send?k=" + sent), 400, `invalid request key`},
		{"a cost's error", ok, []guard.MiddlewareOption{costErr}, get("/send?n=" + sent), 400, `invalid request cost`},
		{"a cost over a rule's capacity", ok, []guard.MiddlewareOption{costBig}, get("/send?n=" + sent), 400, `the request costs more than the limit allows`},
	}
}

// TestMiddlewareBadRequests: each bad request gets its status and a body
// that says what the client can fix.
func TestMiddlewareBadRequests(t *testing.T) {
	g := newGuard(t, testutil.Mini(t), guard.WithRules(funnel.AtMost(3, time.Minute)))
	for _, c := range badRequests() {
		t.Run(c.name, func(t *testing.T) {
			code, body := serveBad(g, c)
			want := `{"error":` + jsonString(t, c.body) + `}`
			if code != c.status || body != want {
				t.Errorf("answer %d %s; want %d %s", code, body, c.status, want)
			}
		})
	}
}

// TestMiddlewareBadRequestsQuoteNothing: no answer to a bad request names
// the code that refused it or quotes what the client sent.
func TestMiddlewareBadRequestsQuoteNothing(t *testing.T) {
	g := newGuard(t, testutil.Mini(t), guard.WithRules(funnel.AtMost(3, time.Minute)))
	for _, c := range badRequests() {
		_, body := serveBad(g, c)
		for _, s := range []string{"guard:", "phonekey:", "funnel:", sent} {
			if strings.Contains(body, s) {
				t.Errorf("%s: the answer %s contains %q", c.name, body, s)
			}
		}
	}
}

// serveBad serves c's request through Middleware, and returns the status
// and the body without its final newline; the handler must not be reached.
func serveBad(g *guard.Guard, c badRequest) (int, string) {
	h := g.Middleware(c.key, c.opts...)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusTeapot)
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, c.r)
	return rec.Code, strings.TrimSuffix(rec.Body.String(), "\n")
}

// jsonString is s as encoding/json writes it in a JSON string.
func jsonString(t *testing.T, s string) string {
	t.Helper()
	var b strings.Builder
	if err := json.NewEncoder(&b).Encode(s); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}
