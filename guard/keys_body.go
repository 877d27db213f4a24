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
// object in the request body ({"phone": "+8613800138000"}), not of nested
// objects: a string, as it decodes, or an integer, as written ("-0" as
// "0"), not normalized further (see WithNormalize, guard/phonekey).
//
// It reads at most maxBytes and always gives r a body that reads the same
// bytes, for the handler. Errors: a longer body, ErrBodyTooLarge; a
// Content-Type other than application/json or +json (a browser sends a
// cross-site form or text/plain without a CORS preflight), ErrContentType;
// no body, not one JSON object, or a member missing, null, empty, of
// another type, named twice or in another case (encoding/json would decode
// {"Phone": ...} into the field tagged "phone"), ErrNoKey. With maxBytes
// below 1, every call fails with ErrInvalidKeyFunc.
func JSONField(field string, maxBytes int64) KeyFunc {
	if maxBytes < 1 {
		return badKeyFunc("JSONField with maxBytes < 1")
	}
	what := fmt.Sprintf("field %q", field)
	return func(r *http.Request) (string, error) {
		switch {
		case noBody(r):
			return "", errNoBody
		case !declaredJSON(r.Header.Get("Content-Type")):
			return "", errNotJSON
		}
		body, err := readBody(r, maxBytes)
		if err != nil {
			return "", err
		}
		return jsonMember(body, field, what)
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

func declaredJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// jsonMember is the key in the member field (what, in a Fix) of the JSON
// object body.
func jsonMember(body []byte, field, what string) (string, error) {
	val, n, exact, err := scanObject(body, field)
	switch {
	case err != nil:
		return "", err
	case n == 0:
		return "", fixable(ErrNoKey, "missing "+what)
	case n > 1:
		return "", fixable(ErrNoKey, what+" given more than once")
	case !exact:
		return "", fixable(ErrNoKey, "missing "+what+" (names are case-sensitive)")
	}
	return jsonKey(val, what)
}

// scanObject reads the JSON object that is all of body but white space,
// and returns how many members are named field in any case (encoding/json's
// rule for struct fields), and the value of one spelled exactly so (a
// number as a json.Number).
func scanObject(body []byte, field string) (val any, n int, exact bool, err error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if !nextIs(dec, json.Delim('{')) {
		return nil, 0, false, errNotJSONObject
	}
	for dec.More() {
		name, v, ok := nextMember(dec)
		if !ok {
			return nil, 0, false, errNotJSONObject
		}
		if strings.EqualFold(name, field) {
			n++
			if name == field {
				val, exact = v, true
			}
		}
	}
	if !nextIs(dec, json.Delim('}')) || !atEOF(dec) {
		return nil, 0, false, errNotJSONObject
	}
	return val, n, exact, nil
}

func nextIs(dec *json.Decoder, d json.Delim) bool {
	t, err := dec.Token()
	return err == nil && t == d
}

func atEOF(dec *json.Decoder) bool {
	_, err := dec.Token()
	return err == io.EOF
}

func nextMember(dec *json.Decoder) (string, any, bool) {
	t, err := dec.Token()
	name, ok := t.(string)
	var val any
	return name, val, err == nil && ok && dec.Decode(&val) == nil
}

// jsonKey is the key val makes, as JSONField says: a fraction or an
// exponent would give one number many spellings, each a key.
func jsonKey(val any, what string) (string, error) {
	switch v := val.(type) {
	case string:
		return single([]string{v}, what)
	case json.Number:
		switch {
		case strings.ContainsAny(string(v), ".eE"):
			return "", fixable(ErrNoKey, what+" must be an integer, without a fraction or an exponent")
		case v == "-0":
			return "0", nil
		}
		return string(v), nil
	}
	return "", fixable(ErrNoKey, what+" must be a string or a number")
}

// FormField returns a KeyFunc that keys on the form field name in the body
// of a POST, PUT or PATCH, as r.PostFormValue decodes it, never the URL
// query (see Query). In an urlencoded body '+' is a space: a client sends
// a plus as %2B (curl --data-urlencode, not curl -d).
//
// It reads at most maxBytes and always gives r a body that reads the same
// bytes, so r.ParseForm works in the handler. Errors: a longer body,
// ErrBodyTooLarge; a Content-Type other than urlencoded or multipart/form-data,
// ErrContentType; another method, no body, a body that does not parse, a
// field missing, empty or given twice (a file part is no value), ErrNoKey.
// With maxBytes below 1, every call fails with ErrInvalidKeyFunc.
func FormField(name string, maxBytes int64) KeyFunc {
	if maxBytes < 1 {
		return badKeyFunc("FormField with maxBytes < 1")
	}
	what := fmt.Sprintf("form field %q", name)
	return func(r *http.Request) (string, error) {
		switch r.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch:
		default:
			return "", errFormMethod
		}
		if noBody(r) {
			return "", errNoBody
		}
		return formField(r, name, what, maxBytes)
	}
}

// formField reads the field name (what, in a Fix), at most maxBytes, from
// a body of one of the two form types.
func formField(r *http.Request, name, what string, maxBytes int64) (string, error) {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	multi := mt == "multipart/form-data" && params["boundary"] != ""
	if err != nil || mt != "application/x-www-form-urlencoded" && !multi {
		return "", errNotForm
	}
	body, err := readBody(r, maxBytes)
	if err != nil {
		return "", err
	}
	vs, err := formValues(body, multi, params["boundary"])
	if err != nil {
		return "", errMalformedForm
	}
	return single(vs[name], what)
}

// formValues decodes a form body as r.ParseMultipartForm (files left out;
// none spills to disk, as none is longer than body) or r.ParseForm does.
func formValues(body []byte, multi bool, boundary string) (url.Values, error) {
	if !multi {
		return url.ParseQuery(string(body))
	}
	form, err := multipart.NewReader(bytes.NewReader(body), boundary).ReadForm(int64(len(body)))
	if err != nil {
		return nil, err
	}
	return form.Value, nil
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
// reads the same bytes from the start, whatever happens. A body over limit
// is an error matching ErrBodyTooLarge; a Content-Length over it leaves the
// body unread.
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

func tooLarge(limit int64, err error) error {
	return &RequestError{Fix: fmt.Sprintf("the body must be at most %d bytes", limit), Err: err}
}
