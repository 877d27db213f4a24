package main

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/nyaruka/phonenumbers"
	"golang.org/x/text/language"
	"golang.org/x/text/language/display"
)

// errNumberRefused reports a valid number that the number policy refuses: it
// cannot receive SMS, or its country is not allowed. It carries a reason.
var errNumberRefused = errors.New("number refused")

// refusal is the number policy's answer for a number it will not text.
type refusal struct {
	Reason string // a token: landline, toll_free, premium_rate, ..., country
	Detail string // a sentence for people
	Number string // the number as read, E.164
	Region string // its region (ISO 3166-1 alpha-2, "001" for none)
}

func (r *refusal) Error() string { return r.Detail }
func (r *refusal) Unwrap() error { return errNumberRefused }

// typeReasons names every number type the policy refuses, with what it is.
// Only MOBILE, and FIXED_LINE_OR_MOBILE in the countries whose numbering
// plan does not tell the two apart (the United States, Canada...), can
// receive a text message.
var typeReasons = map[phonenumbers.PhoneNumberType][2]string{
	phonenumbers.FIXED_LINE:      {"landline", "a landline"},
	phonenumbers.TOLL_FREE:       {"toll_free", "a toll-free number"},
	phonenumbers.PREMIUM_RATE:    {"premium_rate", "a premium-rate number"},
	phonenumbers.SHARED_COST:     {"shared_cost", "a shared-cost number"},
	phonenumbers.VOIP:            {"voip", "a VoIP number"},
	phonenumbers.PERSONAL_NUMBER: {"personal_number", "a personal (forwarding) number"},
	phonenumbers.PAGER:           {"pager", "a pager"},
	phonenumbers.UAN:             {"uan", "a universal access (company) number"},
	phonenumbers.VOICEMAIL:       {"voicemail", "a voicemail access number"},
	phonenumbers.UNKNOWN:         {"unknown", "of an unknown type"},
}

// numberPolicy decides which numbers the service texts.
type numberPolicy struct {
	region  string          // where a number without +<country> is read
	allowed map[string]bool // regions allowed; nil: every region
}

// newNumberPolicy returns the policy for the default region and the
// allow-list: region codes, or "*" for every region; an empty list allows
// the default region only.
func newNumberPolicy(region string, countries []string) (*numberPolicy, error) {
	region = strings.ToUpper(region)
	if !supportedRegion(region) {
		return nil, fmt.Errorf("%w: region %q: not a region with phone numbers (an ISO 3166-1 code such as CN or US)", errConfig, region)
	}
	p := &numberPolicy{region: region}
	if len(countries) == 0 {
		p.allowed = map[string]bool{region: true}
		return p, nil
	}
	if slices.Contains(countries, "*") {
		if len(countries) > 1 {
			return nil, fmt.Errorf("%w: countries: * allows every region and goes alone", errConfig)
		}
		return p, nil
	}
	p.allowed = map[string]bool{}
	for _, c := range countries {
		c = strings.ToUpper(strings.TrimSpace(c))
		if !supportedRegion(c) {
			return nil, fmt.Errorf("%w: countries: %q is not a region with phone numbers", errConfig, c)
		}
		p.allowed[c] = true
	}
	return p, nil
}

func supportedRegion(r string) bool {
	return r != "" && r != "001" && phonenumbers.GetCountryCodeForRegion(r) != 0
}

// errCountryField is parse's error for a region that is not one ("XX",
// "France"): the field's fault, not the number's. It names the field, not
// what the client wrote.
var errCountryField error = &guard.RequestError{
	Fix: `field "country" is not a region code this service knows: give two letters of ISO 3166-1, such as "FR"`,
	Err: fmt.Errorf("%w: not a region with phone numbers", errInvalidCountry),
}

// destination is a number the policy accepted.
type destination struct {
	E164   string // +8613800138000
	Region string // CN
	Prefix string // the pumping limit's key: + country code, first digits
}

// parse reads number as written in region (the default region if empty),
// normalised to E.164 (see parsePhone), and applies the policy. It
// returns, in a guard.RequestError that says what to fix, an error
// matching errInvalidCountry for a region that is not one and
// phonekey.ErrInvalidNumber for what is not a phone number; and a *refusal
// (matching errNumberRefused) for a number the policy will not text.
// prefixDigits is how many digits of the national number the destination's
// Prefix keeps.
func (p *numberPolicy) parse(number, region string, prefixDigits int) (destination, error) {
	defaulted := region == ""
	if defaulted {
		region = p.region
	}
	region = strings.ToUpper(region)
	if !supportedRegion(region) {
		return destination{}, errCountryField
	}
	e164, n, err := parsePhone(number, region)
	if err != nil {
		return destination{}, err
	}
	if err := p.check(e164, n); err != nil {
		var ref *refusal
		if errors.As(err, &ref) && defaulted && !strings.ContainsAny(number, "+\uff0b") && ref.Region == region {
			// 4155552673 meant in the US, read in CN: say how it was read.
			ref.Detail += fmt.Sprintf(" (a number without + is read as one of %s: start it with + and its country code, or pick its country)", regionName(region))
		}
		return destination{}, err
	}
	cc := "+" + strconv.Itoa(int(n.GetCountryCode()))
	national := strings.TrimPrefix(e164, cc)
	return destination{E164: e164, Region: phonenumbers.GetRegionCodeForNumber(n),
		Prefix: cc + national[:min(prefixDigits, len(national))]}, nil
}

// check applies the policy to a valid number.
func (p *numberPolicy) check(e164 string, n *phonenumbers.PhoneNumber) error {
	region := phonenumbers.GetRegionCodeForNumber(n)
	if region == "001" || region == "" {
		// +800, +808, +870, +881, +882, +883, +888, +979: satellite
		// phones, international freephone and premium services, networks
		// of no country. Their rates are set by whoever runs them.
		return &refusal{Reason: "satellite", Detail: fmt.Sprintf("%s is a satellite or non-geographic number (+%d), which cannot receive codes",
			e164, n.GetCountryCode()), Number: e164, Region: "001"}
	}
	if t := phonenumbers.GetNumberType(n); t != phonenumbers.MOBILE && t != phonenumbers.FIXED_LINE_OR_MOBILE {
		why, ok := typeReasons[t]
		if !ok {
			why = typeReasons[phonenumbers.UNKNOWN]
		}
		return &refusal{Reason: why[0], Detail: fmt.Sprintf("%s is %s (%s), which cannot receive codes: give a mobile number",
			e164, why[1], regionName(region)), Number: e164, Region: region}
	}
	if p.allowed != nil && !p.allowed[region] {
		return &refusal{Reason: "country", Detail: fmt.Sprintf("%s is a number of %s, where this service does not send codes",
			e164, regionName(region)), Number: e164, Region: region}
	}
	return nil
}

// country is one region of the page's picker.
type country struct {
	Region string `json:"region"` // ISO 3166-1 alpha-2
	Code   int32  `json:"code"`   // its country calling code
	Name   string `json:"name"`   // in English
}

// countries lists the regions the policy allows, by name, the default
// region first.
func (p *numberPolicy) countries() []country {
	var regions []string
	if p.allowed == nil {
		for r := range phonenumbers.GetSupportedRegions() {
			regions = append(regions, r)
		}
	} else {
		for r := range p.allowed {
			regions = append(regions, r)
		}
	}
	out := make([]country, 0, len(regions))
	for _, r := range regions {
		out = append(out, country{Region: r, Code: int32(phonenumbers.GetCountryCodeForRegion(r)), Name: regionName(r)})
	}
	sort.Slice(out, func(i, j int) bool {
		if (out[i].Region == p.region) != (out[j].Region == p.region) {
			return out[i].Region == p.region
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// regionName is the English name of a region ("China"), or its code.
func regionName(r string) string {
	reg, err := language.ParseRegion(r)
	if err != nil {
		return r
	}
	if name := display.English.Regions().Name(reg); name != "" {
		return name
	}
	return r
}
