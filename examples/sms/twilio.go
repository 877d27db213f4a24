package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

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

// Twilio is a Provider that sends through Twilio's Messages API. It is safe
// for concurrent use.
type Twilio struct {
	endpoint string // POST URL of the Messages resource
	user     string
	secret   string
	from     string
	service  string
	callback string // StatusCallback; "" when none
	client   *http.Client
	// onPrice, when set (by NewService, before any send), takes the price
	// Twilio reports for a message to a number, in its currency.
	onPrice func(to, currency string, price micros)
}

// NewTwilio returns a Twilio provider, or an error matching errTwilioConfig
// when cfg is not valid. The error never holds cfg.AuthToken.
func NewTwilio(cfg TwilioConfig) (*Twilio, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	base := cfg.BaseURL
	if base == "" {
		base = twilioDefaultBaseURL
	}
	client := &http.Client{Timeout: cmp.Or(cfg.Timeout, twilioTimeout)}
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
		from: cfg.From, service: cfg.MessagingServiceSID, callback: cfg.StatusCallback,
		client: client,
	}, nil
}

// Send is SendMessage without the message's sid.
func (t *Twilio) Send(ctx context.Context, to, text string) error {
	_, err := t.SendMessage(ctx, to, text)
	return err
}

// SendMessage creates a message: POST
// /2010-04-01/Accounts/{AccountSid}/Messages.json with To, Body, From or
// MessagingServiceSid, and StatusCallback when configured. It returns the
// message's sid on a 2xx answer holding one; a *TwilioError on any other
// answer, matching ErrDestinationRefused when Twilio refused the destination
// (see TwilioError.Unwrap); another error when no answer came, matching
// ctx.Err() when ctx ended.
func (t *Twilio) SendMessage(ctx context.Context, to, text string) (string, error) {
	form := url.Values{"To": {to}, "Body": {text}}
	if t.from != "" {
		form.Set("From", t.from)
	} else {
		form.Set("MessagingServiceSid", t.service)
	}
	if t.callback != "" {
		form.Set("StatusCallback", t.callback)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return "", fmt.Errorf("twilio: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(t.user, t.secret)
	res, err := t.client.Do(req)
	if err != nil {
		return "", twilioNoAnswer(ctx, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, twilioMaxBody))
	if err != nil {
		return "", twilioNoAnswer(ctx, fmt.Errorf("reading the body of an HTTP %d answer: %w", res.StatusCode, err))
	}
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		var msg struct {
			SID       string  `json:"sid"`
			Price     *string `json:"price"` // "-0.00750", or null until Twilio knows it
			PriceUnit string  `json:"price_unit"`
		}
		if json.Unmarshal(body, &msg) != nil || msg.SID == "" {
			return "", fmt.Errorf("twilio: HTTP %d without a message sid: not known to be sent", res.StatusCode)
		}
		t.reportPrice(to, msg.Price, msg.PriceUnit)
		return msg.SID, nil
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
	return "", e
}

// reportPrice hands a message's price, as Twilio writes it (negative: a
// charge), to onPrice.
func (t *Twilio) reportPrice(to string, price *string, unit string) {
	if t.onPrice == nil || price == nil {
		return
	}
	if m, err := parseMoney(strings.TrimPrefix(*price, "-")); err == nil && m > 0 {
		t.onPrice(to, unit, m)
	}
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
