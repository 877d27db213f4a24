package phonekey

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/nyaruka/phonenumbers"
)

// Errors returned by this package; match them with errors.Is.
var (
	// ErrInvalidNumber means input that is not a phone number: empty, with
	// characters a written number does not have, a country code that does
	// not exist, too few or too many digits, or digits no number of its
	// country has. The error says which, and how to write the number; it
	// never quotes the input. It is a guard.RequestError, whose Fix says
	// the same without the package's name, for the client.
	ErrInvalidNumber = errors.New("phonekey: invalid phone number")
	// ErrInvalidRegion means a default region that is neither "" nor a
	// region with phone numbers (an ISO 3166-1 alpha-2 code such as CN or
	// US): a bug of the caller, not of the client.
	ErrInvalidRegion = errors.New("phonekey: invalid region")
)

// maxLen is the longest input read, in bytes: room for a number written
// with full-width digits (3 bytes each) and spaces, and no more.
const maxLen = 64

// Normalize returns raw in E.164 ("+8613600000009"). A number written
// without a country code (national form, "136 0000 0009", or after the
// region's international prefix, "0086 136...") is read as one of region;
// with region "", only numbers starting with + are read. See Parse for what
// is refused.
func Normalize(raw, region string) (string, error) {
	n, err := Parse(raw, region)
	if err != nil {
		return "", err
	}
	return phonenumbers.Format(n, phonenumbers.E164), nil
}

// Parse reads raw as Normalize does and returns the number, for a caller
// that goes on to check its type or country (phonenumbers.GetNumberType,
// phonenumbers.GetRegionCodeForNumber).
//
// At most 64 bytes, and only the characters of a written number, are accepted: digits of any
// script (full-width ones too), a leading + (or a full-width one), spaces,
// and - . ( ) between groups. phonenumbers digs a number out of anything
// around it ("tel:+44...", "[+44...]", "1-800-FLOWERS", a number after a
// line break): such input is refused, not repaired, since what else the
// client wrote is not ours to guess. The number must then be valid for its
// country's numbering plan (phonenumbers.IsValidNumber), not merely of a
// possible length. An error matches ErrInvalidNumber, or ErrInvalidRegion
// for a bad region.
func Parse(raw, region string) (*phonenumbers.PhoneNumber, error) {
	region = strings.ToUpper(region)
	if !validRegion(region) {
		return nil, fmt.Errorf("%w: %q is not a region with phone numbers (an ISO 3166-1 code such as CN or US)", ErrInvalidRegion, region)
	}
	if err := checkChars(raw); err != nil {
		return nil, invalid(region, err.Error())
	}
	// "ZZ" is phonenumbers' unknown region: only +<country> numbers parse.
	n, err := phonenumbers.Parse(raw, cmp.Or(region, "ZZ"))
	if err != nil {
		return nil, invalid(region, parseReason(err, region))
	}
	if !phonenumbers.IsValidNumber(n) {
		return nil, invalid(region, validReason(n))
	}
	return n, nil
}

// JSONField returns a KeyFunc that keys on the phone number in the member
// field of a JSON request body, in E.164: guard.JSONField(field, maxBytes)
// read through Normalize with region (see From).
func JSONField(field, region string, maxBytes int64) guard.KeyFunc {
	return From(guard.JSONField(field, maxBytes), region)
}

// From returns a KeyFunc that keys on the phone number that key returns, in
// E.164, such as From(guard.FormField("phone", 4<<10), "US"). The errors of
// key pass through unchanged; a key that is not a number is an error
// matching ErrInvalidNumber, which Middleware answers 400 with what to fix
// ({"error": "invalid phone number: too few digits; write it as + ..."}).
// With a bad region or a nil key, every call fails with
// guard.ErrInvalidKeyFunc (a bug of the server: 500).
func From(key guard.KeyFunc, region string) guard.KeyFunc {
	region = strings.ToUpper(region)
	switch {
	case key == nil:
		return failing(fmt.Errorf("%w: phonekey.From with a nil KeyFunc", guard.ErrInvalidKeyFunc))
	case !validRegion(region):
		return failing(fmt.Errorf("%w: phonekey region %q is not a region with phone numbers", guard.ErrInvalidKeyFunc, region))
	}
	return func(r *http.Request) (string, error) {
		raw, err := key(r)
		if err != nil {
			return "", err
		}
		return Normalize(raw, region)
	}
}

func failing(err error) guard.KeyFunc {
	return func(*http.Request) (string, error) { return "", err }
}

// validRegion reports whether region may be a default region: "" or a
// region with phone numbers ("001", the non-geographic numbers, is none:
// their numbers always carry their code).
func validRegion(region string) bool {
	return region == "" || (region != "001" && phonenumbers.GetCountryCodeForRegion(region) != 0)
}

// invalid is ErrInvalidNumber with why and how to write a number read in
// region, in a guard.RequestError whose Fix says the same to the client.
func invalid(region, why string) error {
	how := "write it as + and the country code, then the number"
	if region != "" {
		how += ", or as a national number of " + region
	}
	return &guard.RequestError{
		Fix: "invalid phone number: " + why + "; " + how,
		Err: fmt.Errorf("%w: %s; %s", ErrInvalidNumber, why, how),
	}
}

// checkChars refuses input that is empty, too long, or holds a character a
// written number does not.
func checkChars(raw string) error {
	switch {
	case raw == "":
		return errors.New("empty")
	case len(raw) > maxLen:
		return fmt.Errorf("over %d bytes", maxLen)
	case strings.IndexFunc(raw, func(r rune) bool { return !numberRune(r) }) >= 0:
		return errors.New("only digits, +, spaces and - . ( ) may appear")
	}
	return nil
}

// numberRune reports whether r may appear in a phone number as people write
// it: a digit of any script (full-width ones too), a plus, a space, or the
// punctuation between groups, - . ( ), in ASCII or full width.
func numberRune(r rune) bool {
	switch r {
	case '+', '\uff0b', // plus, full-width plus
		' ', '\u00a0', '\u3000', // space, no-break space, ideographic space
		'-', '\u2010', '\u2011', '\u2012', '\u2013', '\u2014', '\u2212', '\uff0d', // hyphens, dashes, minus
		'.', '\uff0e', '(', ')', '\uff08', '\uff09':
		return true
	}
	return unicode.IsDigit(r)
}

// parseReason says why phonenumbers.Parse refused a number read in region.
func parseReason(err error, region string) string {
	switch {
	case errors.Is(err, phonenumbers.ErrInvalidCountryCode) && region == "":
		return "no country code, or one that does not exist"
	case errors.Is(err, phonenumbers.ErrInvalidCountryCode):
		return "a country code that does not exist"
	case errors.Is(err, phonenumbers.ErrTooShortNSN), errors.Is(err, phonenumbers.ErrTooShortAfterIDD):
		return "too few digits"
	case errors.Is(err, phonenumbers.ErrNumTooLong):
		return "too many digits"
	}
	return "not a phone number"
}

// validReason says why a parsed number is not valid.
func validReason(n *phonenumbers.PhoneNumber) string {
	cc := n.GetCountryCode()
	switch phonenumbers.IsPossibleNumberWithReason(n) {
	case phonenumbers.INVALID_COUNTRY_CODE:
		return "a country code that does not exist"
	case phonenumbers.TOO_SHORT:
		return fmt.Sprintf("too few digits for a number of +%d", cc)
	case phonenumbers.TOO_LONG:
		return fmt.Sprintf("too many digits for a number of +%d", cc)
	}
	return fmt.Sprintf("no number of +%d starts with these digits or has this many", cc)
}
