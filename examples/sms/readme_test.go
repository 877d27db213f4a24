package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// curlStep is one "$ curl ..." line of the README's curl session and the
// answer printed under it.
type curlStep struct {
	line                string
	method, path, body  string
	header              http.Header // the request's, from -H
	status              int         // 0: no status line (no -i)
	statusLine          string
	answerHeader        [][2]string
	answerBody          string
	readmeCode, codeFor string // a "# ... sms to=NUMBER text=... code is CODE" line before this step
}

// readmeSession parses the README's section "A curl session": each "$ curl"
// line's method, path, headers and body, and the lines under it (the
// status line, the headers shown, the JSON body) up to a blank line.
func readmeSession(t *testing.T) []curlStep {
	t.Helper()
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(raw), "\n## A curl session\n")
	if !ok {
		t.Fatal("README.md has no section \"A curl session\"")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	_, block, ok := strings.Cut(sec, "```sh\n")
	if !ok {
		t.Fatal("the curl session has no ```sh block")
	}
	block, _, _ = strings.Cut(block, "```")
	outbox := regexp.MustCompile(`sms to=(\+[0-9]+) text=.*code is ([0-9]{6})\b`)
	var steps []curlStep
	var cur *curlStep
	var code, codeFor string
	for _, line := range strings.Split(block, "\n") {
		switch {
		case strings.HasPrefix(line, "$ "):
			s := parseCurl(t, strings.TrimPrefix(line, "$ "))
			s.readmeCode, s.codeFor, code, codeFor = code, codeFor, "", ""
			steps = append(steps, s)
			cur = &steps[len(steps)-1]
		case strings.HasPrefix(line, "#"):
			if m := outbox.FindStringSubmatch(line); m != nil {
				codeFor, code = m[1], m[2]
			}
			cur = nil
		case strings.TrimSpace(line) == "":
			cur = nil
		case cur == nil:
			t.Fatalf("README curl session: %q is under no curl line", line)
		case strings.HasPrefix(line, "HTTP/"):
			f := strings.SplitN(line, " ", 3)
			cur.statusLine = line
			cur.status, err = strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("README curl session: status line %q", line)
			}
		case strings.HasPrefix(line, "{"):
			cur.answerBody = line
		default:
			name, value, ok := strings.Cut(line, ": ")
			if !ok {
				t.Fatalf("README curl session: %q is neither a status line, a header nor a JSON body", line)
			}
			cur.answerHeader = append(cur.answerHeader, [2]string{name, value})
		}
	}
	return steps
}

// parseCurl reads a curl command line as a shell splits it (single and
// double quotes, a # comment after the command), keeping -X, -H, -d and the
// URL.
func parseCurl(t *testing.T, line string) curlStep {
	t.Helper()
	s := curlStep{line: line, method: http.MethodGet, header: http.Header{}}
	words := shellWords(t, line)
	if len(words) == 0 || words[0] != "curl" {
		t.Fatalf("README curl session: %q is not a curl command", line)
	}
	method := ""
	for i := 1; i < len(words); i++ {
		w := words[i]
		arg := func() string {
			if i+1 >= len(words) {
				t.Fatalf("README curl session: %s without its argument in %q", w, line)
			}
			i++
			return words[i]
		}
		switch {
		case w == "-X":
			method = arg()
		case w == "-H":
			name, value, _ := strings.Cut(arg(), ":")
			s.header.Set(name, strings.TrimSpace(value))
		case w == "-d" || w == "--data":
			s.body, s.method = arg(), http.MethodPost
		case strings.HasPrefix(w, "-"): // -s, -i, -si: how curl prints
		default:
			u, err := url.Parse("http://" + strings.TrimPrefix(w, "http://"))
			if err != nil {
				t.Fatalf("README curl session: URL %q in %q: %v", w, line, err)
			}
			s.path = u.RequestURI()
		}
	}
	if method != "" {
		s.method = method
	}
	if s.path == "" {
		t.Fatalf("README curl session: no URL in %q", line)
	}
	return s
}

// shellWords splits line as sh does, for the quoting the README uses, and
// drops a comment.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\'' || c == '"':
			end := strings.IndexByte(line[i+1:], c)
			if end < 0 {
				t.Fatalf("README curl session: unbalanced %c in %q", c, line)
			}
			w.WriteString(line[i+1 : i+1+end])
			i += end + 1
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			i = len(line)
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// waitWords are the words of a wait in an error ("try again in 1 min"),
// which can be a second shorter than the README's.
var waitWords = regexp.MustCompile(`try again in [0-9]+ (s|min|h)( [0-9]+ min)?`)

// sameAnswer compares the README's JSON body want with got: the same
// members with the same values, but for retry_after, which may be up to
// 2 s shorter, and a wait in words.
func sameAnswer(want, got map[string]any) error {
	if len(want) != len(got) {
		return fmt.Errorf("members %v; want %v", keys(got), keys(want))
	}
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			return fmt.Errorf("no %q", k)
		case k == "retry_after":
			wn, _ := w.(float64)
			gn, ok := g.(float64)
			if !ok || gn > wn || gn < wn-2 {
				return fmt.Errorf("retry_after %v; want %v, or up to 2 s less", g, w)
			}
		case k == "error":
			ws, _ := w.(string)
			gs, _ := g.(string)
			if waitWords.ReplaceAllString(ws, "try again in ...") != waitWords.ReplaceAllString(gs, "try again in ...") {
				return fmt.Errorf("error %q; want %q", gs, ws)
			}
		case !reflect.DeepEqual(w, g):
			return fmt.Errorf("%s %v; want %v", k, g, w)
		}
	}
	return nil
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// The README's curl session is what `go run ./examples/sms` answers: every
// curl line of the section is sent to the binary on its default demo
// configuration (the console provider on loopback, no flags), and the
// status, the headers shown and the JSON body must be the README's, but
// for what differs per run: the code (the README's 477865 is the one its
// outbox line shows, replaced by the code the binary sent to that number)
// and a wait a second or two shorter.
func TestREADMECurlSession(t *testing.T) {
	steps := readmeSession(t)
	if len(steps) < 8 {
		t.Fatalf("%d curl lines in the README's session; want its whole session", len(steps))
	}
	p := startBinary(t, []string{"REDIS_URL=", "SMS_PROVIDER=", "SMS_PUBLIC_URL="})
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	codes := map[string]string{} // the README's code: the binary's
	for _, s := range steps {
		if s.readmeCode != "" {
			codes[s.readmeCode] = outboxCode(t, client, p.base, s.codeFor)
		}
		if s.status == 0 || s.answerBody == "" {
			t.Errorf("README: %q shows no status line or no body: use curl -si, and show the body", s.line)
		}
		body := s.body
		for readme, real := range codes {
			body = strings.ReplaceAll(body, readme, real)
		}
		req, err := http.NewRequest(s.method, p.base+s.path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = s.header
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", s.line, err)
		}
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if got := fmt.Sprintf("HTTP/1.1 %d %s", res.StatusCode, http.StatusText(res.StatusCode)); s.status != 0 && got != s.statusLine {
			t.Errorf("%s\nanswers %s %s\nthe README says %s %s", s.line, got, raw, s.statusLine, s.answerBody)
			continue
		}
		for _, h := range s.answerHeader {
			got := res.Header.Get(h[0])
			if h[0] == "Retry-After" {
				w, _ := strconv.Atoi(h[1])
				if g, err := strconv.Atoi(got); err != nil || g > w || g < w-2 {
					t.Errorf("%s\nRetry-After %q; the README says %s", s.line, got, h[1])
				}
			} else if got != h[1] {
				t.Errorf("%s\n%s %q; the README says %q", s.line, h[0], got, h[1])
			}
		}
		if s.answerBody == "" {
			continue
		}
		var want, got map[string]any
		if err := json.Unmarshal([]byte(s.answerBody), &want); err != nil {
			t.Fatalf("README: the body under %q: %v", s.line, err)
		}
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Errorf("%s\nanswers %s, not a JSON object: %v", s.line, raw, err)
			continue
		}
		if err := sameAnswer(want, got); err != nil {
			t.Errorf("%s\nanswers %s\nthe README says %s\n(%v)", s.line, raw, s.answerBody, err)
		}
	}
	if len(codes) == 0 {
		t.Error("the README's session verifies no code it was sent")
	}
}

// outboxCode is the code of the newest message the binary at base sent to
// number, from its demo outbox.
func outboxCode(t *testing.T, client *http.Client, base, number string) string {
	t.Helper()
	res, err := client.Get(base + "/api/sms/outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var box struct {
		Messages []struct{ To, Text string }
	}
	if err := json.NewDecoder(res.Body).Decode(&box); err != nil {
		t.Fatalf("outbox: %v", err)
	}
	for _, m := range box.Messages { // newest first
		if c := regexp.MustCompile(`code is ([0-9]{6})\b`).FindStringSubmatch(m.Text); m.To == number && c != nil {
			return c[1]
		}
	}
	t.Fatalf("README: the outbox has no code sent to %s (%+v)", number, box.Messages)
	return ""
}
