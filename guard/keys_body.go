package guard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
)

// JSONField returns a KeyFunc that keys on the member field of the JSON
// object in the request body ({"phone": "+8613800138000"}), for a JSON API;
// members of nested objects are not read.
// The member is a string, keyed on as it decodes, or an integer, keyed on
// as written ("-0" as "0"); the key is not normalized further (see
// Policy.Normalize; for a phone number, phonekey.JSONField in package
// guard/phonekey keys on its E.164 form).
//
// It reads at most maxBytes of the body, and always gives r a body that
// reads the same bytes, whatever it found, so the handler decodes the
// request itself. A body longer than maxBytes, by its Content-Length (then
// left unread) or as read, is an error matching ErrBodyTooLarge.
//
// The body must be declared as application/json or a +json type
// (application/problem+json), with any parameters; another Content-Type,
// or none, is an error matching ErrContentType. Browsers send a cross-site
// form or a text/plain fetch without asking the server first (no CORS
// preflight): refusing them keeps any web page from making its visitors
// spend the limit.
//
// A request without a body, a body that is not one JSON object (with
// nothing after it but white space), and a member that is missing, null,
// empty, of another type, or named twice are errors matching ErrNoKey. So
// is a member whose name differs from field only in case, alone or beside
// field: encoding/json decodes {"Phone": ...} into the struct field tagged
// "phone", so the handler could read a number other than the key.
// With maxBytes below 1, every call fails with ErrInvalidKeyFunc.
func JSONField(field string, maxBytes int64) KeyFunc {
	if maxBytes < 1 {
		return badKeyFunc("JSONField with maxBytes < 1")
	}
	return func(r *http.Request) (string, error) {
		body, err := jsonBody(r, maxBytes)
		if err != nil {
			return "", err
		}
		return jsonMember(body, field)
	}
}

// These errors say nothing of the request, so they are made once.
var (
	errNoBody        = fixable(ErrNoKey, "missing request body")
	errNotJSONObject = fixable(ErrNoKey, "the body must be a JSON object")
	errMalformedForm = fixable(ErrNoKey, "malformed form body")
	errNotJSON       = fixable(ErrContentType, "the body must be declared as Content-Type: application/json")
	errNotForm       = fixable(ErrContentType, "the body must be declared as Content-Type: application/x-www-form-urlencoded or multipart/form-data")
	errFormMethod    = fixable(ErrNoKey, "a form must be sent with POST, PUT or PATCH")
)

// jsonBody reads r's body, at most maxBytes, if it is declared as JSON.
func jsonBody(r *http.Request, maxBytes int64) ([]byte, error) {
	if noBody(r) {
		return nil, errNoBody
	}
	if !declaredJSON(r.Header.Get("Content-Type")) {
		return nil, errNotJSON
	}
	return readBody(r, maxBytes)
}

// declaredJSON reports whether the Content-Type ct is application/json or
// an application/...+json type, with any parameters.
func declaredJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// jsonMember is the key in the member field of the JSON object body.
func jsonMember(body []byte, field string) (string, error) {
	m, err := scanObject(body, field)
	if err != nil {
		return "", err
	}
	val, err := m.single(field)
	if err != nil {
		return "", err
	}
	return jsonKey(val, field)
}

// jsonMatch is what scanObject found of the members named field in any
// case: how many, and the value of one spelled exactly so.
type jsonMatch struct {
	n     int
	exact bool
	val   json.RawMessage
}

// scanObject reads the JSON object that is all of body but white space,
// noting the members named field.
func scanObject(body []byte, field string) (jsonMatch, error) {
	var m jsonMatch
	dec := json.NewDecoder(bytes.NewReader(body))
	if !nextIs(dec, json.Delim('{')) {
		return m, errNotJSONObject
	}
	for dec.More() {
		name, val, err := nextMember(dec)
		if err != nil {
			return m, err
		}
		m.add(name, field, val)
	}
	if !nextIs(dec, json.Delim('}')) || !atEOF(dec) {
		return m, errNotJSONObject
	}
	return m, nil
}

// nextIs reports whether dec's next token is the delimiter d.
func nextIs(dec *json.Decoder, d json.Delim) bool {
	t, err := dec.Token()
	return err == nil && t == d
}

// atEOF reports whether dec has nothing more but white space.
func atEOF(dec *json.Decoder) bool {
	_, err := dec.Token()
	return err == io.EOF
}

// nextMember reads the name and the value of an object's next member.
func nextMember(dec *json.Decoder) (string, json.RawMessage, error) {
	t, err := dec.Token()
	name, ok := t.(string)
	if err != nil || !ok {
		return "", nil, errNotJSONObject
	}
	var val json.RawMessage
	if err := dec.Decode(&val); err != nil {
		return "", nil, errNotJSONObject
	}
	return name, val, nil
}

// add notes the member name of value val if it is field in any case:
// encoding/json's own rule for struct fields.
func (m *jsonMatch) add(name, field string, val json.RawMessage) {
	if !strings.EqualFold(name, field) {
		return
	}
	m.n++
	if name == field {
		m.val, m.exact = val, true
	}
}

// single is the value of the one member named field, spelled as field.
func (m jsonMatch) single(field string) (json.RawMessage, error) {
	switch {
	case m.n == 0:
		return nil, fixable(ErrNoKey, fmt.Sprintf("missing field %q", field))
	case m.n > 1:
		return nil, fixable(ErrNoKey, fmt.Sprintf("field %q given more than once", field))
	case !m.exact:
		return nil, fixable(ErrNoKey, fmt.Sprintf("missing field %q (names are case-sensitive)", field))
	}
	return m.val, nil
}

// jsonKey is the key that the value val of the member field makes.
func jsonKey(val json.RawMessage, field string) (string, error) {
	switch val[0] {
	case '"':
		return jsonString(val, field)
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return jsonInteger(val, field)
	}
	return "", fixable(ErrNoKey, fmt.Sprintf("field %q must be a string or a number", field))
}

// jsonString is the key of a string value: the string, decoded.
func jsonString(val json.RawMessage, field string) (string, error) {
	var s string
	if err := json.Unmarshal(val, &s); err != nil {
		return "", errNotJSONObject
	}
	if s == "" {
		return "", fixable(ErrNoKey, fmt.Sprintf("empty field %q", field))
	}
	return s, nil
}

// jsonInteger is the key of a number value: the integer as written, with
// "-0" as "0".
func jsonInteger(val json.RawMessage, field string) (string, error) {
	// A fraction or an exponent would give one number many spellings,
	// each a key of its own.
	if bytes.ContainsAny(val, ".eE") {
		return "", fixable(ErrNoKey, fmt.Sprintf("field %q must be an integer, without a fraction or an exponent", field))
	}
	if string(val) == "-0" {
		return "0", nil
	}
	return string(val), nil
}

// FormField returns a KeyFunc that keys on the form field name in the body
// of a POST, PUT or PATCH request, as r.PostFormValue decodes it: the body
// is application/x-www-form-urlencoded or multipart/form-data (a file part
// is not a value), and another Content-Type, or none, is an error matching
// ErrContentType. Unlike r.FormValue, it never falls back to the URL
// query, which any link can set: see Query for that.
//
// In an urlencoded body '+' stands for a space, as the HTML standard says:
// "phone=+8613800138000" is " 8613800138000", and a client must send a plus
// as %2B. curl -d sends its argument as it is, so curl -d phone=+86...
// sends a space; curl --data-urlencode phone=+86... sends %2B. A JSON API
// has no such trap: see JSONField.
//
// It reads at most maxBytes of the body and always gives r a body that
// reads the same bytes, so r.ParseForm still works in the handler. A body
// longer than maxBytes is an error matching ErrBodyTooLarge. Another method,
// no body, a body that does not parse, and a field that is missing, empty or
// given twice (handlers differ on which one they read) are errors matching
// ErrNoKey. With maxBytes below 1, every call fails with ErrInvalidKeyFunc.
func FormField(name string, maxBytes int64) KeyFunc {
	if maxBytes < 1 {
		return badKeyFunc("FormField with maxBytes < 1")
	}
	return func(r *http.Request) (string, error) {
		if err := formRequest(r); err != nil {
			return "", err
		}
		return formField(r, name, maxBytes)
	}
}

// formRequest checks that r may have a form body: a POST, PUT or PATCH with
// a body.
func formRequest(r *http.Request) error {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		return errFormMethod
	}
	if noBody(r) {
		return errNoBody
	}
	return nil
}

// formField reads the field name, at most maxBytes, from a body of one of
// the two form types.
func formField(r *http.Request, name string, maxBytes int64) (string, error) {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case err != nil:
	case mt == "application/x-www-form-urlencoded":
		return urlencodedField(r, name, maxBytes)
	case mt == "multipart/form-data" && params["boundary"] != "":
		return multipartField(r, params["boundary"], name, maxBytes)
	}
	return "", errNotForm
}

func urlencodedField(r *http.Request, name string, maxBytes int64) (string, error) {
	body, err := readBody(r, maxBytes)
	if err != nil {
		return "", err
	}
	vs, err := url.ParseQuery(string(body))
	if err != nil {
		return "", errMalformedForm
	}
	return single(vs, name, "form field")
}

func multipartField(r *http.Request, boundary, name string, maxBytes int64) (string, error) {
	body, err := readBody(r, maxBytes)
	if err != nil {
		return "", err
	}
	vs, err := multipartValues(body, boundary, name)
	if err != nil {
		return "", errMalformedForm
	}
	return single(url.Values{name: vs}, name, "form field")
}

// multipartValues returns the values of the parts named name, leaving out
// files as r.ParseMultipartForm does.
func multipartValues(body []byte, boundary, name string) ([]string, error) {
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	var vs []string
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return vs, nil
		}
		if err != nil {
			return nil, err
		}
		if !isValue(p, name) {
			continue
		}
		v, err := io.ReadAll(p)
		if err != nil {
			return nil, err
		}
		vs = append(vs, string(v))
	}
}

// isValue reports whether the part p is a value of the field name, not a
// file.
func isValue(p *multipart.Part, name string) bool {
	return p.FormName() == name && p.FileName() == ""
}

func noBody(r *http.Request) bool {
	return r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0
}

// replay is a body read in part, then given back: the bytes read, then the
// rest of the original, which it closes.
type replay struct {
	io.Reader
	io.Closer
}

// readBody reads r's body, at most limit bytes, and gives r a body that
// reads the same bytes from the start, whatever happens: the handler reads
// the body the client sent. A body over limit is an error matching
// ErrBodyTooLarge; a Content-Length over it leaves the body unread.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, tooLarge(limit, fmt.Errorf("%w: Content-Length over %d bytes", ErrBodyTooLarge, limit))
	}
	// One byte more than limit (limit itself at math.MaxInt64) tells a body
	// of exactly limit bytes from a longer one.
	orig := r.Body
	body, err := io.ReadAll(io.LimitReader(orig, min(limit, math.MaxInt64-1)+1))
	if err == nil && int64(len(body)) <= limit { // the whole body
		r.Body = replay{bytes.NewReader(body), orig}
		return body, nil
	}
	r.Body = replay{io.MultiReader(bytes.NewReader(body), orig), orig}
	return nil, bodyError(err, limit)
}

// bodyError is readBody's error for a read of a body over limit (err nil),
// or that failed with err.
func bodyError(err error, limit int64) error {
	var mbe *http.MaxBytesError
	switch {
	case err == nil:
		return tooLarge(limit, fmt.Errorf("%w: over %d bytes", ErrBodyTooLarge, limit))
	case errors.As(err, &mbe): // an http.MaxBytesReader around the body
		return tooLarge(min(limit, mbe.Limit), fmt.Errorf("%w: %w", ErrBodyTooLarge, err))
	}
	return &RequestError{Fix: "the request body could not be read", Err: fmt.Errorf("guard: reading the body: %w", err)}
}

// tooLarge is the error err of a body longer than limit bytes.
func tooLarge(limit int64, err error) error {
	return &RequestError{Fix: fmt.Sprintf("the body must be at most %d bytes", limit), Err: err}
}
