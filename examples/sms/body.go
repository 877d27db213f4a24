package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"
	"unicode"

	"github.com/funnelguard/funnelguard/guard"
)

// maxBody is the largest request body accepted, in bytes.
const maxBody = 4096

var (
	// errMediaType reports a body not declared as JSON.
	errMediaType = errors.New("body not declared as application/json")
	// errBody reports a body that decode refused: its error is a
	// guard.RequestError whose Fix says what to change, as guard.JSONField's
	// do.
	errBody = errors.New("bad request body")
)

// bodyError is errBody with what to fix, for the client.
func bodyError(format string, args ...any) error {
	fix := fmt.Sprintf(format, args...)
	return &guard.RequestError{Fix: fix, Err: fmt.Errorf("%w: %s", errBody, fix)}
}

// decode reads a small JSON body into v, a pointer to a struct: one object
// of v's fields (their json names, spelled exactly so), each at most once,
// of the field's type, and nothing after it but white space, all within
// maxBody bytes; the fields named in required must be present and neither
// null nor "". The body must be declared as application/json: a cross-site
// form or a fetch with a text/plain body is sent by browsers without asking
// the server first (no CORS preflight), and would let any web page make its
// visitors request codes, each from their own address.
//
// A member named twice is refused, not read last-wins, as guard.JSONField
// refuses it: a key read from one and a handler's value from the other
// would be two numbers. A name in another case ("Phone") is refused too,
// which encoding/json alone would read into the field.
//
// Errors: errMediaType (415), an *http.MaxBytesError (413), or errBody in a
// guard.RequestError that says what to fix (400): a missing or empty field,
// a field of the wrong type, an unknown field, a field given twice, or
// malformed JSON with the byte where it breaks. None quotes a value the
// client sent; an unknown field's name is quoted when it is short and
// printable.
func decode(r *http.Request, v any, required ...string) error {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return errMediaType
	}
	if r.ContentLength > maxBody {
		return &http.MaxBytesError{Limit: maxBody} // refused unread
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return err
	case err != nil: // cut by -read-timeout, say
		return bodyError("the request body could not be read")
	}
	obj, err := oneObject(body)
	if err != nil {
		return err
	}
	members, err := scanMembers(obj, jsonFields(v))
	if err != nil {
		return err
	}
	for _, name := range required {
		switch val, ok := members[name]; {
		case !ok:
			return bodyError("missing field %q", name)
		case string(val) == `""`:
			return bodyError("empty field %q", name)
		case string(val) == "null":
			return bodyError("field %q must be a string, not null", name)
		}
	}
	return unmarshal(obj, v)
}

// oneObject returns the JSON object that is all of body but white space.
func oneObject(body []byte) (json.RawMessage, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, bodyError("missing request body")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var obj json.RawMessage
	if err := dec.Decode(&obj); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, bodyError("malformed JSON at byte %d", se.Offset)
		}
		return nil, bodyError("malformed JSON: the body ends at byte %d, before its JSON does", len(body))
	}
	end := int(dec.InputOffset())
	if i := bytes.IndexFunc(body[end:], func(r rune) bool { return !isJSONSpace(r) }); i >= 0 {
		return nil, bodyError("the body must be one JSON object, with nothing after it (byte %d)", end+i+1)
	}
	if obj[0] != '{' {
		return nil, bodyError("the body must be a JSON object")
	}
	return obj, nil
}

func isJSONSpace(r rune) bool { return r == ' ' || r == '\t' || r == '\r' || r == '\n' }

// scanMembers returns the members of the valid JSON object obj by name,
// refusing a name not among fields and a name given twice.
func scanMembers(obj json.RawMessage, fields map[string]bool) (map[string]json.RawMessage, error) {
	members := map[string]json.RawMessage{}
	dec := json.NewDecoder(bytes.NewReader(obj))
	if _, err := dec.Token(); err != nil { // {
		return nil, bodyError("the body must be a JSON object")
	}
	for dec.More() {
		t, err := dec.Token()
		name, _ := t.(string)
		var val json.RawMessage
		if err == nil {
			err = dec.Decode(&val)
		}
		switch {
		case err != nil: // obj is valid JSON: not met
			return nil, bodyError("the body must be a JSON object")
		case !fields[name]:
			return nil, unknownField(name, fields)
		case members[name] != nil:
			return nil, bodyError("field %q given more than once", name)
		}
		members[name] = val
	}
	return members, nil
}

// unknownField is the error of a member name not among fields: named when
// it is short and printable, and with the field it spells in another case,
// if any.
func unknownField(name string, fields map[string]bool) error {
	for f := range fields {
		if strings.EqualFold(name, f) {
			return bodyError("unknown field %q: did you mean %q? (names are case-sensitive)", name, f)
		}
	}
	if len(name) > 32 || strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return bodyError("an unknown field")
	}
	return bodyError("unknown field %q", name)
}

// unmarshal decodes obj, whose members are all fields of v, into v.
func unmarshal(obj json.RawMessage, v any) error {
	err := json.Unmarshal(obj, v)
	var te *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te) && te.Field != "":
		return bodyError("field %q must be %s", te.Field, jsonKind(te.Type))
	}
	return bodyError("the body must be a JSON object of the fields named in the API")
}

// jsonKind says what JSON value decodes into a Go value of type t.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "a number" // the ints, uints and floats; no field is of another kind
}

// jsonFields is the set of the JSON names of the struct that v points to.
func jsonFields(v any) map[string]bool {
	t := reflect.TypeOf(v).Elem()
	fields := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case !f.IsExported() || name == "-":
		case name == "":
			fields[f.Name] = true
		default:
			fields[name] = true
		}
	}
	return fields
}

// badRequest answers a body that decode refused: 415 when it is not
// declared as JSON, 413 when it is too large, 400 with what to fix
// otherwise.
func badRequest(w http.ResponseWriter, err error) {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.Is(err, errMediaType):
		writeJSON(w, http.StatusUnsupportedMediaType, reply{Error: "Content-Type must be application/json"})
	case errors.As(err, &tooLarge):
		writeJSON(w, http.StatusRequestEntityTooLarge, reply{Error: "request too large"})
	default:
		writeJSON(w, http.StatusBadRequest, reply{Error: fixOf(err, "bad request")})
	}
}

// fixOf is the Fix of the first guard.RequestError in err's chain, or def:
// what the client can fix, never an error chain of the server.
func fixOf(err error, def string) string {
	var re *guard.RequestError
	if errors.As(err, &re) && re.Fix != "" {
		return re.Fix
	}
	return def
}
