// Package phonekey keys a guard on a phone number, whatever way the client
// wrote it: "+86 136 0000 0009", "+86-136-0000-0009", "0086 13600000009"
// and "13600000009" read in CN are all the key "+8613600000009" (E.164), so
// that re-spelling a number does not buy it another allowance.
//
//	g, err := guard.New(client, guard.WithPrefix("sms:phone:"), guard.WithRules(rules...))
//	phone := phonekey.JSONField("phone", "CN", 4<<10) // {"phone": "136 0000 0009"}
//	http.Handle("POST /send", g.Middleware(phone)(sendCode))
//
// A number that is not one (a typo, a letter, a country code that does not
// exist, too few or too many digits for its country) is an error matching
// ErrInvalidNumber that says what to fix and never quotes the input;
// Middleware answers it 400 Bad Request.
//
// Numbers are read with github.com/nyaruka/phonenumbers (Google's
// libphonenumber). It is a package of its own so that a program importing
// only mutex, funnel or guard does not build that library and its metadata.
//
// phonekey decides only what a number is, not whether to text it: a
// landline, a premium-rate number or a country you do not serve is still a
// valid key. Check the number's type and country yourself (Parse returns
// the number for that), as examples/sms does before it charges any limit.
package phonekey
