package discovery

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAPIErrorExpired(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  APIError
		want bool
	}{
		{"410 Expired", APIError{StatusCode: 410, Reason: "Expired"}, true},
		{"410 Gone", APIError{StatusCode: 410, Reason: "Gone"}, true},
		{"410 without reason", APIError{StatusCode: 410}, true},
		{"reason Expired in a 200 ERROR event", APIError{Reason: "Expired"}, true},
		{"504 with cause ResourceVersionTooLarge", APIError{StatusCode: 504, Reason: "Timeout", causes: []string{"ResourceVersionTooLarge"}}, true},
		{"504 saying Too large resource version", APIError{StatusCode: 504, Reason: "Timeout", Message: "Too large resource version: 9, current: 8"}, true},
		{"504 timeout", APIError{StatusCode: 504, Reason: "Timeout", Message: "request timed out"}, false},
		{"500", APIError{StatusCode: 500, Reason: "InternalError"}, false},
		{"429", APIError{StatusCode: 429, Reason: "TooManyRequests"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.err.expired())
		})
	}
}

// body is a response body that records how much of it was read, and
// whether it was closed.
type body struct {
	r      *strings.Reader
	closed bool
}

func (b *body) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *body) Close() error               { b.closed = true; return nil }

func TestReadError(t *testing.T) {
	r := request{verb: "watch", resource: "endpointslices.discovery.k8s.io", namespace: "ns"}
	page := "<html>\n<body>" + strings.Repeat("x", 1<<20) + "</body></html>\n" // 1 MiB and 28 bytes: 1047580 more than the 1024 kept
	for _, tc := range []struct {
		name       string
		code       int
		header     map[string]string
		body       string
		want       APIError
		retryAfter time.Duration
		causes     []string
		unread     int // bytes of the body left unread
	}{
		{"Status body", 403, nil,
			`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"nope","reason":"Forbidden","code":403}`,
			APIError{StatusCode: 403, Reason: "Forbidden", Message: "nope"}, 0, nil, 0},
		{"Status with causes and retryAfterSeconds", 504, nil,
			`{"kind":"Status","message":"Too large resource version","reason":"Timeout","code":504,"details":{"causes":[{"reason":"ResourceVersionTooLarge"}],"retryAfterSeconds":2}}`,
			APIError{StatusCode: 504, Reason: "Timeout", Message: "Too large resource version"}, 2 * time.Second, []string{"ResourceVersionTooLarge"}, 0},
		{"Retry-After header", 429, map[string]string{"Retry-After": "3"},
			`{"kind":"Status","message":"slow down","reason":"TooManyRequests","code":429}`,
			APIError{StatusCode: 429, Reason: "TooManyRequests", Message: "slow down"}, 3 * time.Second, nil, 0},
		{"Retry-After as a date is ignored", 503, map[string]string{"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, "",
			APIError{StatusCode: 503, Reason: "Service Unavailable"}, 0, nil, 0},
		{"a proxy's text body", 502, nil, "upstream connect error\n",
			APIError{StatusCode: 502, Reason: "Bad Gateway", Message: "upstream connect error"}, 0, nil, 0},
		{"white space collapsed", 502, nil, "upstream\r\n\n  connect\terror\n",
			APIError{StatusCode: 502, Reason: "Bad Gateway", Message: "upstream connect error"}, 0, nil, 0},
		{"a 1 MiB error page", 502, nil, page,
			APIError{StatusCode: 502, Reason: "Bad Gateway", Message: "<html> <body>" + strings.Repeat("x", maxErrorMessage-13) + "... (1047580 more bytes)"}, 0, nil, 0},
		{"a page over what is drained", 502, nil, page + strings.Repeat("y", 100<<10),
			APIError{StatusCode: 502, Reason: "Bad Gateway", Message: "<html> <body>" + strings.Repeat("x", maxErrorMessage-13) + "... (over 1113088 more bytes)"}, 0, nil, 36892},
		{"cut at a rune boundary", 500, nil, strings.Repeat("€", 1000), // 3 bytes each
			APIError{StatusCode: 500, Reason: "Internal Server Error", Message: strings.Repeat("€", 341) + "... (1977 more bytes)"}, 0, nil, 0},
		{"a Status with a long message", 500, nil,
			`{"kind":"Status","message":"` + strings.Repeat("m", 5000) + `","reason":"InternalError","code":500}`,
			APIError{StatusCode: 500, Reason: "InternalError", Message: strings.Repeat("m", maxErrorMessage) + "... (3976 more bytes)"}, 0, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			for k, v := range tc.header {
				rec.Header().Set(k, v)
			}
			rec.WriteHeader(tc.code)
			resp := rec.Result()
			b := &body{r: strings.NewReader(tc.body)}
			resp.Body = b
			e := readError(resp, r)
			tc.want.Verb, tc.want.Resource, tc.want.Namespace = r.verb, r.resource, r.namespace
			tc.want.retryAfter, tc.want.causes = tc.retryAfter, tc.causes
			require.Equal(t, tc.want, *e)
			assert.True(t, utf8.ValidString(e.Message), "the message is not UTF-8")
			assert.Equal(t, tc.unread, b.r.Len(), "bytes left unread, for the connection to be reused")
			assert.True(t, b.closed, "the body was not closed")
			_, err := io.ReadAll(b.r)
			require.NoError(t, err)
		})
	}
}

// The Status of a watch ERROR event, up to maxEventBytes, is clipped too.
func TestStatusErrorClipped(t *testing.T) {
	e := request{verb: "watch"}.error(status{Kind: "Status", Code: 500, Reason: "InternalError", Message: strings.Repeat("m", 8<<20)}, 0)
	assert.Equal(t, 500, e.StatusCode)
	assert.Equal(t, strings.Repeat("m", maxErrorMessage)+"... (8387584 more bytes)", e.Message)
}
