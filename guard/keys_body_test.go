package guard_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/funnel"
	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/internal/testutil"
)

// bodyCase is a request with a body, and the key a KeyFunc should find in
// it: want, or an error matching err.
type bodyCase struct {
	name    string
	method  string // POST when empty
	ct      string
	body    string
	chunked bool // no Content-Length: the length is found by reading
	limit   int  // an http.MaxBytesReader of limit bytes around the body
	want    string
	err     error
}

func (c bodyCase) request() *http.Request {
	method := c.method
	if method == "" {
		method = http.MethodPost
	}
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	r := httptest.NewRequest(method, "/send?phone=%2B8613800138000", body)
	if c.ct != "" {
		r.Header.Set("Content-Type", c.ct)
	}
	if c.chunked {
		r.ContentLength = -1
		r.Body = io.NopCloser(strings.NewReader(c.body))
	}
	if c.limit > 0 {
		r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, int64(c.limit))
	}
	return r
}

// runBodyCases checks each case's key, and that the handler then reads the
// very body the client sent (up to the MaxBytesReader's limit, if any),
// whatever the KeyFunc found.
func runBodyCases(t *testing.T, key guard.KeyFunc, cases []bodyCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.request()
			got, err := key(r)
			switch {
			case tc.err != nil && !errors.Is(err, tc.err):
				t.Fatalf("key = %q, %v; want an error matching %v", got, err, tc.err)
			case tc.err == nil && (err != nil || got != tc.want):
				t.Fatalf("key = %q, %v; want %q", got, err, tc.want)
			}
			for _, s := range []error{guard.ErrNoKey, guard.ErrBodyTooLarge, guard.ErrContentType} {
				if err != nil && errors.Is(err, s) != (s == tc.err) {
					t.Fatalf("error %v matches %v", err, s)
				}
			}
			want := tc.body
			if tc.limit > 0 && len(want) > tc.limit {
				want = want[:tc.limit]
			}
			var rest []byte
			if r.Body != nil {
				rest, _ = io.ReadAll(r.Body)
				if err := r.Body.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
			}
			if string(rest) != want {
				t.Fatalf("handler reads %q; want the body sent, %q", rest, want)
			}
		})
	}
}

func TestJSONField(t *testing.T) {
	const js = "application/json"
	big := `{"phone":"+8613800138000","pad":"` + strings.Repeat("x", 100) + `"}`
	runBodyCases(t, guard.JSONField("phone", int64(len(big))), []bodyCase{
		{name: "string", ct: js, body: `{"phone":"+8613800138000","country":"CN"}`, want: "+8613800138000"},
		{name: "plus kept", ct: js, body: `{"phone":"+86 138"}`, want: "+86 138"},
		{name: "escapes", ct: js, body: `{"ph\u006fne":"\u002b86\t1"}`, want: "+86\t1"},
		{name: "charset", ct: "application/json; charset=utf-8", body: `{"phone":"1"}`, want: "1"},
		{name: "media type case", ct: "Application/JSON", body: `{"phone":"1"}`, want: "1"},
		{name: "+json", ct: "application/vnd.api+json", body: `{"phone":"1"}`, want: "1"},
		{name: "integer", ct: js, body: `{"phone":8613800138000}`, want: "8613800138000"},
		{name: "negative zero", ct: js, body: `{"phone":-0}`, want: "0"},
		{name: "white space", ct: js, body: " \n{ \"phone\" : \"1\" }\r\n\t ", want: "1"},
		{name: "other members of any type", ct: js, body: `{"a":[1,{"phone":"x"}],"b":null,"phone":"1","c":{"d":true}}`, want: "1"},
		{name: "exactly the limit", ct: js, body: big, want: "+8613800138000"},
		{name: "exactly the limit, chunked", ct: js, body: big, chunked: true, want: "+8613800138000"},

		{name: "one byte over", ct: js, body: big + " ", err: guard.ErrBodyTooLarge},
		{name: "one byte over, chunked", ct: js, body: big + " ", chunked: true, err: guard.ErrBodyTooLarge},
		{name: "far over", ct: js, body: big + strings.Repeat(" ", 1<<20), err: guard.ErrBodyTooLarge},
		{name: "far over, chunked", ct: js, body: big + strings.Repeat(" ", 1<<20), chunked: true, err: guard.ErrBodyTooLarge},
		{name: "MaxBytesReader around the body", ct: js, body: big, limit: 10, err: guard.ErrBodyTooLarge},

		{name: "text/plain", ct: "text/plain", body: `{"phone":"1"}`, err: guard.ErrContentType},
		{name: "no Content-Type", body: `{"phone":"1"}`, err: guard.ErrContentType},
		{name: "form", ct: "application/x-www-form-urlencoded", body: `{"phone":"1"}`, err: guard.ErrContentType},
		{name: "text/json", ct: "text/json", body: `{"phone":"1"}`, err: guard.ErrContentType},
		{name: "application/jsonx", ct: "application/jsonx", body: `{"phone":"1"}`, err: guard.ErrContentType},
		{name: "malformed Content-Type", ct: "application/json; charset", body: `{"phone":"1"}`, err: guard.ErrContentType},

		{name: "GET without body", method: http.MethodGet, err: guard.ErrNoKey},
		{name: "POST without body", ct: js, err: guard.ErrNoKey},
		{name: "missing", ct: js, body: `{"number":"1"}`, err: guard.ErrNoKey},
		{name: "nested only", ct: js, body: `{"user":{"phone":"1"}}`, err: guard.ErrNoKey},
		{name: "null", ct: js, body: `{"phone":null}`, err: guard.ErrNoKey},
		{name: "empty", ct: js, body: `{"phone":""}`, err: guard.ErrNoKey},
		{name: "bool", ct: js, body: `{"phone":true}`, err: guard.ErrNoKey},
		{name: "object", ct: js, body: `{"phone":{"n":"1"}}`, err: guard.ErrNoKey},
		{name: "array", ct: js, body: `{"phone":["1"]}`, err: guard.ErrNoKey},
		{name: "fraction", ct: js, body: `{"phone":1.0}`, err: guard.ErrNoKey},
		{name: "exponent", ct: js, body: `{"phone":1e3}`, err: guard.ErrNoKey},
		{name: "twice", ct: js, body: `{"phone":"1","phone":"2"}`, err: guard.ErrNoKey},
		{name: "other case alone", ct: js, body: `{"Phone":"1"}`, err: guard.ErrNoKey},
		{name: "other case beside", ct: js, body: `{"phone":"1","PHONE":"2"}`, err: guard.ErrNoKey},
		{name: "not an object", ct: js, body: `["phone","1"]`, err: guard.ErrNoKey},
		{name: "top-level string", ct: js, body: `"phone"`, err: guard.ErrNoKey},
		{name: "malformed", ct: js, body: `{"phone":"1"`, err: guard.ErrNoKey},
		{name: "malformed member", ct: js, body: `{"phone":"1","x":}`, err: guard.ErrNoKey},
		{name: "trailing data", ct: js, body: `{"phone":"1"}x`, err: guard.ErrNoKey},
		{name: "second object", ct: js, body: `{"phone":"1"}{"phone":"2"}`, err: guard.ErrNoKey},
		{name: "form body", ct: js, body: `phone=1`, err: guard.ErrNoKey},
	})
}

func TestJSONFieldKelvin(t *testing.T) {
	// encoding/json matches "\u212aey" (KELVIN SIGN) to a field "key".
	runBodyCases(t, guard.JSONField("key", 100), []bodyCase{
		{name: "Kelvin sign beside", ct: "application/json", body: `{"\u212aey":"1","key":"2"}`, err: guard.ErrNoKey},
		{name: "plain", ct: "application/json", body: `{"key":"2"}`, want: "2"},
	})
}

func multipartBody(t *testing.T, parts ...[3]string) (ct, body string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for _, p := range parts { // name, file name, value
		var pw io.Writer
		var err error
		if p[1] != "" {
			pw, err = w.CreateFormFile(p[0], p[1])
		} else {
			pw, err = w.CreateFormField(p[0])
		}
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(pw, p[2])
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return w.FormDataContentType(), b.String()
}

func TestFormField(t *testing.T) {
	const form = "application/x-www-form-urlencoded"
	mct, mbody := multipartBody(t, [3]string{"country", "", "CN"}, [3]string{"phone", "", "+8613800138000"})
	tct, mtwice := multipartBody(t, [3]string{"phone", "", "1"}, [3]string{"phone", "", "2"})
	fct, mfile := multipartBody(t, [3]string{"phone", "phone.txt", "1"}, [3]string{"phone", "", "2"})
	foct, mfileOnly := multipartBody(t, [3]string{"phone", "phone.txt", "1"})
	const limit = 1000
	runBodyCases(t, guard.FormField("phone", limit), []bodyCase{
		{name: "urlencoded", ct: form, body: "country=CN&phone=%2B8613800138000", want: "+8613800138000"},
		{name: "plus is a space", ct: form, body: "phone=+8613800138000", want: " 8613800138000"},
		{name: "PUT", method: http.MethodPut, ct: form, body: "phone=1", want: "1"},
		{name: "PATCH", method: http.MethodPatch, ct: form, body: "phone=1", want: "1"},
		{name: "charset", ct: form + "; charset=utf-8", body: "phone=1", want: "1"},
		{name: "chunked", ct: form, body: "phone=1", chunked: true, want: "1"},
		{name: "multipart", ct: mct, body: mbody, want: "+8613800138000"},
		{name: "multipart file left out", ct: fct, body: mfile, want: "2"},

		{name: "query never read", ct: form, body: "country=CN", err: guard.ErrNoKey},
		{name: "GET reads no body", method: http.MethodGet, ct: form, body: "phone=1", err: guard.ErrNoKey},
		{name: "DELETE reads no body", method: http.MethodDelete, ct: form, body: "phone=1", err: guard.ErrNoKey},
		{name: "GET without body", method: http.MethodGet, err: guard.ErrNoKey},
		{name: "POST without body", ct: form, err: guard.ErrNoKey},
		{name: "empty", ct: form, body: "phone=", err: guard.ErrNoKey},
		{name: "twice", ct: form, body: "phone=1&phone=2", err: guard.ErrNoKey},
		{name: "malformed escape", ct: form, body: "phone=%zz", err: guard.ErrNoKey},
		{name: "semicolon", ct: form, body: "phone=1;x=2", err: guard.ErrNoKey},
		{name: "multipart twice", ct: tct, body: mtwice, err: guard.ErrNoKey},
		{name: "multipart file only", ct: foct, body: mfileOnly, err: guard.ErrNoKey},
		{name: "multipart truncated", ct: mct, body: mbody[:len(mbody)-10], err: guard.ErrNoKey},
		{name: "multipart, other boundary", ct: "multipart/form-data; boundary=other", body: mbody, err: guard.ErrNoKey},

		{name: "multipart without boundary", ct: "multipart/form-data", body: mbody, err: guard.ErrContentType},
		{name: "JSON", ct: "application/json", body: `{"phone":"1"}`, err: guard.ErrContentType},
		{name: "text/plain", ct: "text/plain", body: "phone=1", err: guard.ErrContentType},
		{name: "no Content-Type", body: "phone=1", err: guard.ErrContentType},

		{name: "over the limit", ct: form, body: "phone=1&pad=" + strings.Repeat("x", limit), err: guard.ErrBodyTooLarge},
		{name: "over the limit, chunked", ct: form, body: "phone=1&pad=" + strings.Repeat("x", limit), chunked: true, err: guard.ErrBodyTooLarge},
	})
}

// After FormField, the handler's own r.ParseForm sees the same form.
func TestFormFieldParseFormAfter(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/send", strings.NewReader("phone=%2B86&x=y"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if k, err := guard.FormField("phone", 100)(r); err != nil || k != "+86" {
		t.Fatalf("key = %q, %v", k, err)
	}
	if got := r.PostFormValue("x"); got != "y" {
		t.Fatalf("PostFormValue(x) = %q; want y", got)
	}
}

// A body whose reading fails gives the error, not a key, and the handler
// reads what was read and then the same failure.
func TestBodyReadError(t *testing.T) {
	broken := errors.New("connection reset")
	r := httptest.NewRequest(http.MethodPost, "/send", nil)
	r.Header.Set("Content-Type", "application/json")
	r.ContentLength = -1
	r.Body = io.NopCloser(io.MultiReader(strings.NewReader(`{"phone":`), &failing{broken}))
	_, err := guard.JSONField("phone", 100)(r)
	if !errors.Is(err, broken) || errors.Is(err, guard.ErrNoKey) {
		t.Fatalf("err = %v; want the read error", err)
	}
	got, err := io.ReadAll(r.Body)
	if string(got) != `{"phone":` || !errors.Is(err, broken) {
		t.Fatalf("handler reads %q, %v", got, err)
	}
}

type failing struct{ err error }

func (f *failing) Read([]byte) (int, error) { return 0, f.err }

// The handler behind Middleware decodes the whole body JSONField read.
func TestJSONFieldMiddlewareBodyIntact(t *testing.T) {
	g := newGuard(t, testutil.Mini(t), guard.WithRules(funnel.AtMost(1, time.Minute)))
	sent := `{"phone":"+8613800138000","country":"CN","pad":"` + strings.Repeat("x", 1000) + `"}`
	var got []byte
	h := g.Middleware(guard.JSONField("phone", 4<<10))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Phone, Country, Pad string }
		got, _ = io.ReadAll(http.MaxBytesReader(w, r.Body, 4<<10))
		if err := json.Unmarshal(got, &req); err != nil || req.Country != "CN" {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	for i, want := range []int{http.StatusAccepted, http.StatusTooManyRequests} {
		r := httptest.NewRequest(http.MethodPost, "/send", strings.NewReader(sent))
		r.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != want {
			t.Fatalf("request %d: %d %s; want %d", i+1, rec.Code, rec.Body, want)
		}
	}
	if string(got) != sent {
		t.Fatalf("handler read %d bytes, not the %d sent", len(got), len(sent))
	}
	// A text/plain body never reaches the handler.
	r := httptest.NewRequest(http.MethodPost, "/send", strings.NewReader(`{"phone":"+8613900139000"}`))
	r.Header.Set("Content-Type", "text/plain")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusBadRequest && rec.Code != http.StatusUnsupportedMediaType {
		t.Fatalf("text/plain: %d; want 400 or 415", rec.Code)
	}
}

// A KeyFunc keeps no state: one serves many requests at once (run with
// -race).
func TestKeyFuncsConcurrent(t *testing.T) {
	key := guard.Join(guard.Route, guard.ClientIP(prefixes("10.0.0.0/8")...), guard.JSONField("phone", 100))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				body := `{"phone":"` + strings.Repeat("1", i+1) + `"}`
				r := httptest.NewRequest(http.MethodPost, "/send", strings.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				r.RemoteAddr = "10.0.0.1:1"
				r.Header.Set("X-Forwarded-For", "203.0.113.7")
				got, err := key(r)
				if want := "POST /send|203.0.113.7|" + strings.Repeat("1", i+1); err != nil || got != want {
					t.Errorf("goroutine %d, request %d: %q, %v; want %q", i, j, got, err, want)
					return
				}
				if b, _ := io.ReadAll(r.Body); string(b) != body {
					t.Errorf("body %q; want %q", b, body)
					return
				}
			}
		})
	}
	wg.Wait()
}
