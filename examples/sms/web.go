package main

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
)

// pageCSP is the page's Content-Security-Policy: its own script and style
// only, requests to its own origin only, and no framing (clickjacking a
// "Send code" button would make visitors pay for someone's SMS).
const pageCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// secured sets the security headers on every answer.
func secured(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", pageCSP)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}

// jsonErrors answers the requests mux has no route for (404, and 405 with
// its Allow header) in JSON, like every other error of the API.
func jsonErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			h.ServeHTTP(w, r)
			return
		}
		// The mux's own answer: a redirect to the clean path, or a plain
		// text 404 or 405. Keep its status and headers, not its text.
		c := &statusOnly{header: http.Header{}}
		h.ServeHTTP(c, r)
		switch c.status {
		case http.StatusNotFound:
			writeJSON(w, http.StatusNotFound, reply{Error: "not found"})
		case http.StatusMethodNotAllowed:
			w.Header()["Allow"] = c.header["Allow"]
			writeJSON(w, http.StatusMethodNotAllowed, reply{Error: "method not allowed"})
		default:
			for k, v := range c.header {
				if k != "Content-Type" && k != "Content-Length" {
					w.Header()[k] = v
				}
			}
			w.WriteHeader(c.status)
		}
	})
}

// statusOnly is a ResponseWriter that keeps the header and status, and
// drops the body.
type statusOnly struct {
	header http.Header
	status int
}

func (c *statusOnly) Header() http.Header { return c.header }
func (c *statusOnly) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return len(p), nil
}
func (c *statusOnly) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}

// servePage routes the page, index.html at / and its other files (script,
// style) by name. Not "GET /": a pattern for every GET would answer GET
// /api/sms/send with a 404 instead of a 405, and list GET in the Allow
// header of the API's 405s.
func servePage(mux *http.ServeMux) {
	page, err := fs.Sub(webFS, "web")
	if err != nil {
		panic(err) // the embedded tree always has web
	}
	files := http.FileServerFS(page)
	mux.Handle("GET /{$}", files)
	entries, _ := fs.ReadDir(page, ".")
	for _, e := range entries {
		if !e.IsDir() && e.Name() != "index.html" {
			mux.Handle("GET /"+e.Name(), files)
		}
	}
}

// settings is what the page needs to know: the default region, the
// countries it may pick, whether the demo outbox is served, and whether
// this is a local demo, whose limits the page may reset (POST
// /api/demo/reset).
type settings struct {
	Region    string    `json:"region"`
	Countries []country `json:"countries"`
	Outbox    bool      `json:"outbox"`
	Demo      bool      `json:"demo"`
}

func (s *Service) settings(w http.ResponseWriter, r *http.Request) {
	writeAny(w, http.StatusOK, settings{Region: s.numbers.region, Countries: s.numbers.countries(), Outbox: s.outbox != nil,
		Demo: s.demo && localClient(r)})
}

// showOutbox answers the demo outbox: the last messages the console
// provider printed, newest first. It is routed only when the service
// listens on loopback with the console provider and no proxy in front (see
// main.go), and answered only to a loopback client with no forwarding
// header.
func (s *Service) showOutbox(w http.ResponseWriter, r *http.Request) {
	if !localClient(r) {
		// A request a proxy forwarded, or from another machine: the codes
		// are for the person at this one.
		writeJSON(w, http.StatusNotFound, reply{Error: "not found"})
		return
	}
	writeAny(w, http.StatusOK, struct {
		Messages []outboxMessage `json:"messages"`
	}{s.outbox()})
}

// writeAny answers v in JSON, never cached.
func writeAny(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// humanWait says d in the largest unit that keeps it readable:
// "47 s", "12 min", "3 h 5 min".
func humanWait(seconds int64) string {
	switch {
	case seconds < 60:
		return strconv.FormatInt(seconds, 10) + " s"
	case seconds < 3600:
		return strconv.FormatInt((seconds+59)/60, 10) + " min"
	}
	h, m := seconds/3600, (seconds%3600+59)/60
	if m == 60 {
		h, m = h+1, 0
	}
	var b strings.Builder
	b.WriteString(strconv.FormatInt(h, 10) + " h")
	if m > 0 {
		b.WriteString(" " + strconv.FormatInt(m, 10) + " min")
	}
	return b.String()
}
