package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"
)

// errTwilioConfig is the error, matched with errors.Is, of a Twilio
// configuration NewTwilio refuses.
var errTwilioConfig = errors.New("invalid Twilio configuration")

const (
	// twilioDefaultBaseURL is Twilio's REST API.
	twilioDefaultBaseURL = "https://api.twilio.com"
	// twilioTimeout bounds a request of the default HTTP client.
	twilioTimeout = 10 * time.Second
	// twilioMaxBody is the most of an answer's body that Send reads.
	twilioMaxBody = 64 << 10
	// twilioMaxText is the most of Twilio's message and more_info that an
	// error keeps.
	twilioMaxText = 512
)

// TwilioConfig configures a Twilio provider (see NewTwilio).
type TwilioConfig struct {
	// BaseURL is the root of Twilio's REST API, http or https, with no
	// query; it may have a path (a proxy's prefix). Empty: https://api.twilio.com.
	BaseURL string
	// AccountSID is the account that sends: "AC" and 32 hex digits. It is in
	// the path of every request, and is the user name of the basic
	// authentication when APIKeySID is empty.
	AccountSID string
	// AuthToken is the password of the basic authentication: the account's
	// auth token, or the API key's secret when APIKeySID is set. Required.
	AuthToken string
	// APIKeySID, if set, is an API key ("SK" and 32 hex digits) of the
	// account: the user name of the basic authentication, with AuthToken its
	// secret.
	APIKeySID string
	// From is the sender: a Twilio number in E.164 ("+15017122661") or an
	// alphanumeric sender ID (up to 11 letters, digits, spaces and + - _ &,
	// at least one letter). Set exactly one of From and MessagingServiceSID.
	From string
	// MessagingServiceSID is a Messaging Service ("MG" and 32 hex digits)
	// that picks the sender. Set exactly one of From and MessagingServiceSID.
	MessagingServiceSID string
	// HTTPClient sends the requests; nil: a client with a 10 s timeout.
	// Send uses a copy that never follows a redirect.
	HTTPClient *http.Client
}

// Twilio is a Provider that sends through Twilio's Messages API. It is safe
// for concurrent use.
type Twilio struct {
	endpoint string // POST URL of the Messages resource
	user     string
	secret   string
	from     string
	service  string
	client   *http.Client
}

// NewTwilio returns a Twilio provider, or an error matching errTwilioConfig
// when cfg is not valid. The error never holds cfg.AuthToken.
func NewTwilio(cfg TwilioConfig) (*Twilio, error) {
	bad := func(format string, args ...any) (*Twilio, error) {
		return nil, fmt.Errorf("%w: %s", errTwilioConfig, fmt.Sprintf(format, args...))
	}
	base := cfg.BaseURL
	if base == "" {
		base = twilioDefaultBaseURL
	}
	// The values are not quoted back: a secret pasted in the wrong place
	// would end up in a log.
	u, err := url.Parse(base)
	switch {
	case err != nil:
		return bad("the base URL does not parse")
	case u.User != nil:
		return bad("the base URL holds credentials")
	case u.Scheme != "http" && u.Scheme != "https":
		return bad("base URL %s: the scheme is not http or https", u.Redacted())
	case u.Host == "" || u.Opaque != "":
		return bad("base URL %s has no host", u.Redacted())
	case strings.ContainsAny(base, "?#"):
		return bad("base URL %s has a query or a fragment", u.Redacted())
	case !twilioSID(cfg.AccountSID, "AC"):
		return bad("the account SID is not AC and 32 hex digits")
	case cfg.APIKeySID != "" && !twilioSID(cfg.APIKeySID, "SK"):
		return bad("the API key SID is not SK and 32 hex digits")
	case cfg.AuthToken == "":
		return bad("no auth token")
	case strings.IndexFunc(cfg.AuthToken, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return bad("the auth token holds a space or a control character")
	case (cfg.From == "") == (cfg.MessagingServiceSID == ""):
		return bad("set exactly one of From and MessagingServiceSID")
	case cfg.MessagingServiceSID != "" && !twilioSID(cfg.MessagingServiceSID, "MG"):
		return bad("the messaging service SID is not MG and 32 hex digits")
	case cfg.From != "" && !twilioE164(cfg.From) && !twilioAlphaSender(cfg.From):
		return bad("From is neither an E.164 number nor an alphanumeric sender ID")
	}
	client := &http.Client{Timeout: twilioTimeout}
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient
		client = &c
	}
	// A redirect would carry the credentials elsewhere, and Twilio answers a
	// message with none: the redirect itself is the answer, an error.
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	user := cfg.AccountSID
	if cfg.APIKeySID != "" {
		user = cfg.APIKeySID
	}
	return &Twilio{
		endpoint: strings.TrimRight(base, "/") + "/2010-04-01/Accounts/" + cfg.AccountSID + "/Messages.json",
		user:     user, secret: cfg.AuthToken,
		from: cfg.From, service: cfg.MessagingServiceSID,
		client: client,
	}, nil
}

// Send creates a message: POST /2010-04-01/Accounts/{AccountSid}/Messages.json
// with To, Body, and From or MessagingServiceSid. It returns nil on a 2xx
// answer holding the message's sid; a *TwilioError on any other answer,
// matching ErrDestinationRefused when Twilio refused the destination (see
// TwilioError.Unwrap); another error when no answer came, matching
// ctx.Err() when ctx ended.
func (t *Twilio) Send(ctx context.Context, to, text string) error {
	form := url.Values{"To": {to}, "Body": {text}}
	if t.from != "" {
		form.Set("From", t.from)
	} else {
		form.Set("MessagingServiceSid", t.service)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return fmt.Errorf("twilio: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(t.user, t.secret)
	res, err := t.client.Do(req)
	if err != nil {
		return twilioNoAnswer(ctx, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, twilioMaxBody))
	if err != nil {
		return twilioNoAnswer(ctx, fmt.Errorf("reading the body of an HTTP %d answer: %w", res.StatusCode, err))
	}
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		var msg struct {
			SID string `json:"sid"`
		}
		if json.Unmarshal(body, &msg) != nil || msg.SID == "" {
			return fmt.Errorf("twilio: HTTP %d without a message sid: not known to be sent", res.StatusCode)
		}
		return nil
	}
	e := &TwilioError{Status: res.StatusCode}
	var answer struct {
		Code     int    `json:"code"`
		Message  string `json:"message"`
		MoreInfo string `json:"more_info"`
	}
	if json.Unmarshal(body, &answer) == nil {
		e.Code = answer.Code
		e.Message = t.scrub(answer.Message, to)
		e.MoreInfo = t.scrub(answer.MoreInfo, to)
	}
	return e
}

// scrub readies a text of Twilio's for an error, which the service logs: it
// bounds it, and takes out the recipient's number (logs mask numbers) and
// the secret, should an answer ever echo them.
func (t *Twilio) scrub(s, to string) string {
	s = strings.ReplaceAll(s, t.secret, "[secret]")
	if to != "" {
		s = strings.ReplaceAll(s, to, "[To]")
		if digits := strings.TrimPrefix(to, "+"); len(digits) >= 4 {
			s = strings.ReplaceAll(s, digits, "[To]")
		}
	}
	if len(s) > twilioMaxText {
		s = strings.ToValidUTF8(s[:twilioMaxText], "") + "…"
	}
	return s
}

// twilioNoAnswer wraps err, the failure to get an answer, so that it matches
// ctx.Err() when ctx ended.
func twilioNoAnswer(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("twilio: %w: %w", cerr, err)
	}
	return fmt.Errorf("twilio: %w", err)
}

// TwilioError is an answer of Twilio's other than a success. Twilio's error
// answers are JSON: {"code": 21211, "message": "...", "more_info":
// "https://www.twilio.com/docs/errors/21211", "status": 400}.
type TwilioError struct {
	// Status is the HTTP status of the answer.
	Status int
	// Code is Twilio's error code; 0 when the answer held none (not JSON,
	// or empty, as from a proxy).
	Code int
	// Message is Twilio's message, bounded, with the recipient's number
	// replaced by "[To]".
	Message string
	// MoreInfo is the address of the code's page in Twilio's error dictionary.
	MoreInfo string
}

// Error describes the answer.
func (e *TwilioError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "twilio: HTTP %d", e.Status)
	if text := http.StatusText(e.Status); text != "" {
		b.WriteString(" " + text)
	}
	if e.Code != 0 {
		fmt.Fprintf(&b, ": error %d", e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.MoreInfo != "" {
		b.WriteString(" (" + e.MoreInfo + ")")
	}
	return b.String()
}

// Unwrap returns ErrDestinationRefused when Twilio refused the destination
// for good: a 4xx answer whose code is about the To number (see
// twilioRefusal); nil otherwise.
func (e *TwilioError) Unwrap() error {
	if e.Status >= 400 && e.Status < 500 && twilioRefusal(e.Code) {
		return ErrDestinationRefused
	}
	return nil
}

// twilioRefusal reports whether code, in Twilio's error dictionary
// (https://www.twilio.com/docs/api/errors/<code>), is a refusal of the
// destination itself, which sending again will not change. Codes about our
// account, sender or request are not (21401 and 21606, 21659, 21660, 21661
// are about the From; 21407 about a number's configuration; 21608 about a
// trial account; 20003 our credentials; 20429 our rate).
func twilioRefusal(code int) bool {
	switch code {
	case 21211, // Invalid 'To' Phone Number
		21214, // 'To' phone number cannot be reached
		21217, // Phone number does not appear to be valid
		21265, // 'To' number cannot be a Short Code
		21266, // 'To' and 'From' numbers cannot be the same
		21268, // Sending to Premium rate or Information Service numbers is not allowed
		21408, // Permission to send to the region of the 'To' number not enabled
		21610, // Attempt to send to unsubscribed recipient (replied STOP)
		21612, // The 'To' number is not reachable (via SMS, from our sender)
		21614, // 'To' number is not a valid mobile number
		21635: // 'To' number cannot be a landline
		return true
	}
	return false
}

// twilioSID reports whether s is prefix and 32 hex digits, as Twilio's SIDs.
func twilioSID(s, prefix string) bool {
	if len(s) != len(prefix)+32 || !strings.HasPrefix(s, prefix) {
		return false
	}
	for _, r := range s[len(prefix):] {
		if !strings.ContainsRune("0123456789abcdefABCDEF", r) {
			return false
		}
	}
	return true
}

// twilioE164 reports whether s is a number in E.164: a plus, then up to 15
// digits, the first not 0.
func twilioE164(s string) bool {
	if len(s) < 3 || len(s) > 16 || s[0] != '+' || s[1] == '0' {
		return false
	}
	for _, r := range s[1:] {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// twilioAlphaSender reports whether s is an alphanumeric sender ID as Twilio
// takes them: 1 to 11 of A-Z, a-z, 0-9, space, + - _ &, at least one letter.
func twilioAlphaSender(s string) bool {
	if len(s) == 0 || len(s) > 11 {
		return false
	}
	letter := false
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z':
			letter = true
		case r >= '0' && r <= '9' || strings.ContainsRune(" +-_&", r):
		default:
			return false
		}
	}
	return letter
}

// twilioFromEnv reads a TwilioConfig from the environment: TWILIO_ACCOUNT_SID,
// TWILIO_AUTH_TOKEN, TWILIO_API_KEY_SID, TWILIO_FROM,
// TWILIO_MESSAGING_SERVICE_SID and TWILIO_API_URL; baseURL, when not empty,
// wins over TWILIO_API_URL.
func twilioFromEnv(getenv func(string) string, baseURL string) TwilioConfig {
	if baseURL == "" {
		baseURL = getenv("TWILIO_API_URL")
	}
	return TwilioConfig{
		BaseURL:             baseURL,
		AccountSID:          getenv("TWILIO_ACCOUNT_SID"),
		AuthToken:           getenv("TWILIO_AUTH_TOKEN"),
		APIKeySID:           getenv("TWILIO_API_KEY_SID"),
		From:                getenv("TWILIO_FROM"),
		MessagingServiceSID: getenv("TWILIO_MESSAGING_SERVICE_SID"),
	}
}
