package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"
)

// errTwilioConfig is the error, matched with errors.Is, of a Twilio
// configuration NewTwilio refuses.
var errTwilioConfig = errors.New("invalid Twilio configuration")

// TwilioConfig configures a Twilio provider (see NewTwilio). Its errors name
// each setting the way the service takes it: the environment variable, and
// the flag that overrides it.
type TwilioConfig struct {
	// BaseURL is the root of Twilio's REST API: https, or http to a loopback
	// host only (basic authentication would cross the network in clear
	// text); no query; it may have a path (a proxy's prefix). Empty:
	// https://api.twilio.com.
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
	// StatusCallback, if set, is the URL (http or https, no query) Twilio
	// posts each message's delivery reports to, signed with the account's
	// auth token: so it needs AuthToken to be that token, not an API key's
	// secret (APIKeySID empty).
	StatusCallback string
	// Timeout bounds a request of the default HTTP client; 0: 10 s.
	Timeout time.Duration
	// HTTPClient sends the requests; nil: a client with Timeout. Send uses a
	// copy that never follows a redirect.
	HTTPClient *http.Client
}

// Where each setting is set, as the errors say it. The auth token has no
// flag: a flag's value is in every process listing.
const (
	twilioNameURL      = "TWILIO_API_URL (or -twilio-url)"
	twilioNameAccount  = "TWILIO_ACCOUNT_SID (or -twilio-account-sid)"
	twilioNameToken    = "TWILIO_AUTH_TOKEN"
	twilioNameKey      = "TWILIO_API_KEY_SID (or -twilio-api-key-sid)"
	twilioNameFrom     = "TWILIO_FROM (or -twilio-from)"
	twilioNameService  = "TWILIO_MESSAGING_SERVICE_SID (or -twilio-messaging-service-sid)"
	twilioNameCallback = "SMS_PUBLIC_URL (or -public-url)"
)

// twilioFlags registers the Twilio provider's flags on fl, each defaulting
// to its environment variable (read with getenv once fl is parsed, see
// fromEnv), and returns a function that gives their TwilioConfig once fl is
// parsed. The auth token is read
// from TWILIO_AUTH_TOKEN only. With a public URL, the status callback is
// that URL's reportPath.
func twilioFlags(fl *flag.FlagSet, getenv func(string) string) func() TwilioConfig {
	c := TwilioConfig{AuthToken: getenv("TWILIO_AUTH_TOKEN")}
	fl.StringVar(&c.BaseURL, "twilio-url", "", "base URL of Twilio's REST API (default $TWILIO_API_URL, else https://api.twilio.com)")
	fl.StringVar(&c.AccountSID, "twilio-account-sid", "", "Twilio account SID, AC... (default $TWILIO_ACCOUNT_SID; the token: $TWILIO_AUTH_TOKEN only)")
	fl.StringVar(&c.APIKeySID, "twilio-api-key-sid", "", "Twilio API key SID, SK..., whose secret is $TWILIO_AUTH_TOKEN (default $TWILIO_API_KEY_SID)")
	fl.StringVar(&c.From, "twilio-from", "", "sender: a Twilio number in E.164 or an alphanumeric sender ID (default $TWILIO_FROM)")
	fl.StringVar(&c.MessagingServiceSID, "twilio-messaging-service-sid", "",
		"Twilio Messaging Service SID, MG..., instead of -twilio-from (default $TWILIO_MESSAGING_SERVICE_SID)")
	public := fl.String("public-url", "", "the service's public base URL, as Twilio reaches it: "+
		"Twilio then posts delivery reports to it, and an undelivered code is refunded from the budget (default $SMS_PUBLIC_URL; empty: off)")
	return func() TwilioConfig {
		fromEnv(fl, getenv, map[string]string{"twilio-url": "TWILIO_API_URL", "twilio-account-sid": "TWILIO_ACCOUNT_SID",
			"twilio-api-key-sid": "TWILIO_API_KEY_SID", "twilio-from": "TWILIO_FROM",
			"twilio-messaging-service-sid": "TWILIO_MESSAGING_SERVICE_SID", "public-url": "SMS_PUBLIC_URL"})
		out := c
		if *public != "" {
			out.StatusCallback = strings.TrimRight(*public, "/") + reportPath
		}
		return out
	}
}

// check returns an error matching errTwilioConfig when c is not valid. The
// error names the environment variable and flag to set, and quotes no value
// but a URL's, as given (with no credentials, and the token taken out).
func (c TwilioConfig) check() error {
	if err := c.checkURLs(); err != nil {
		return err
	}
	if err := c.checkCredentials(); err != nil {
		return err
	}
	return c.checkSender()
}

func (c TwilioConfig) checkURLs() error {
	if c.BaseURL != "" {
		if err := c.checkURL(c.BaseURL, twilioNameURL, true); err != nil {
			return err
		}
	}
	if c.StatusCallback != "" {
		if err := c.checkURL(c.StatusCallback, twilioNameCallback, false); err != nil {
			return err
		}
		if c.APIKeySID != "" {
			return fmt.Errorf("%w: %s needs the account's auth token in %s, which Twilio signs delivery reports with: "+
				"unset %s (an API key's secret cannot check them)", errTwilioConfig, twilioNameCallback, twilioNameToken, twilioNameKey)
		}
	}
	return nil
}

// checkURL checks raw, the setting name: an http or https URL with a host
// and no query, fragment or credentials; http to a loopback host only when
// secret is set (basic authentication travels to it).
func (c TwilioConfig) checkURL(raw, name string, secret bool) error {
	bad := func(why string) error { return fmt.Errorf("%w: %s: %s", errTwilioConfig, name, why) }
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return bad("does not parse as a URL (not repeated: it may hold a secret)")
	case u.User != nil:
		return bad("holds credentials (not repeated): put them in " + twilioNameAccount + " and " + twilioNameToken)
	}
	shown := raw
	if c.AuthToken != "" {
		shown = strings.ReplaceAll(shown, c.AuthToken, "[secret]")
	}
	schemes := "http or https"
	if secret {
		schemes = "https (or http to a loopback host)"
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return bad(fmt.Sprintf("%q: the scheme must be %s", shown, schemes))
	case u.Host == "" || u.Opaque != "":
		return bad(fmt.Sprintf("%q has no host", shown))
	case strings.ContainsAny(raw, "?#"):
		return bad(fmt.Sprintf("%q has a query or a fragment", shown))
	case secret && u.Scheme == "http" && !loopbackHost(u.Hostname()):
		return bad(fmt.Sprintf("%q: http only to a loopback host (127.0.0.0/8, ::1, localhost), since basic authentication "+
			"would cross the network in clear text: use https", shown))
	}
	return nil
}

func (c TwilioConfig) checkCredentials() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errTwilioConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case !twilioSID(c.AccountSID, "AC"):
		return bad("set %s: it must be AC followed by 32 hex digits", twilioNameAccount)
	case c.APIKeySID != "" && !twilioSID(c.APIKeySID, "SK"):
		return bad("%s must be SK followed by 32 hex digits, or unset", twilioNameKey)
	case c.AuthToken == "":
		return bad("set %s: the account's auth token, or with %s the API key's secret", twilioNameToken, twilioNameKey)
	case strings.IndexFunc(c.AuthToken, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return bad("%s holds a space or a control character", twilioNameToken)
	}
	return nil
}

func (c TwilioConfig) checkSender() error {
	switch {
	case (c.From == "") == (c.MessagingServiceSID == ""):
		return fmt.Errorf("%w: set exactly one of %s and %s", errTwilioConfig, twilioNameFrom, twilioNameService)
	case c.MessagingServiceSID != "" && !twilioSID(c.MessagingServiceSID, "MG"):
		return fmt.Errorf("%w: %s must be MG followed by 32 hex digits", errTwilioConfig, twilioNameService)
	case c.From != "" && !twilioE164(c.From) && !twilioAlphaSender(c.From):
		return fmt.Errorf("%w: %s must be a number in E.164 (+15017122661) or an alphanumeric sender ID "+
			"(up to 11 letters, digits, spaces and + - _ &, at least one letter)", errTwilioConfig, twilioNameFrom)
	}
	return nil
}

// loopbackHost reports whether host, a URL's host name without its port,
// is this machine: localhost, or an address of 127.0.0.0/8 or ::1.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
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
