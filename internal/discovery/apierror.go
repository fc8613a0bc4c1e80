package discovery

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// APIError is an error response from the Kubernetes API server, decoded from
// its Status body. Use errors.As to get it from NewServerList's error.
type APIError struct {
	StatusCode int    // HTTP status, such as 403
	Reason     string // Status reason, such as "Forbidden" or "Expired"
	Message    string // Status message from the server, or its body; cut to 1 KiB

	// The request that failed: verb ("list", "watch" or "get"), resource
	// ("endpointslices.discovery.k8s.io" or "endpoints") and namespace.
	Verb, Resource, Namespace string

	retryAfter time.Duration // from Retry-After or details.retryAfterSeconds
	causes     []string      // details.causes[].reason
}

func (e *APIError) Error() string {
	req := fmt.Sprintf("%s %s in namespace %q", e.Verb, e.Resource, e.Namespace)
	switch e.StatusCode {
	case http.StatusForbidden:
		return fmt.Sprintf("%s is forbidden: the Role bound to this service account must allow verb %q on %s in that namespace (see the README's RBAC manifest): %s",
			req, e.Verb, e.Resource, e.Message)
	case http.StatusUnauthorized:
		return fmt.Sprintf("%s: unauthorized: the bearer token is missing, expired or revoked: %s", req, e.Message)
	}
	return fmt.Sprintf("%s: %d %s: %s", req, e.StatusCode, e.Reason, e.Message)
}

// expired reports whether the error says the requested resource version is
// gone (410, reason Expired or Gone) or newer than the server has seen: both
// mean relist from scratch.
func (e *APIError) expired() bool {
	if e.StatusCode == http.StatusGone || e.Reason == "Expired" || e.Reason == "Gone" {
		return true
	}
	for _, c := range e.causes {
		if c == "ResourceVersionTooLarge" {
			return true
		}
	}
	return strings.Contains(e.Message, "Too large resource version")
}

// status is the JSON of a metav1.Status.
type status struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Code    int    `json:"code"`
	Details *struct {
		Causes []struct {
			Reason string `json:"reason"`
		} `json:"causes"`
		RetryAfterSeconds int `json:"retryAfterSeconds"`
	} `json:"details"`
}

// request names an API request for errors.
type request struct {
	verb, resource, namespace string
}

func (r request) error(s status, httpCode int) *APIError {
	e := &APIError{StatusCode: httpCode, Reason: clip(s.Reason, 0, false), Message: clip(s.Message, 0, false), Verb: r.verb, Resource: r.resource, Namespace: r.namespace}
	if e.StatusCode == 0 || e.StatusCode == http.StatusOK {
		e.StatusCode = s.Code
	}
	if s.Details != nil {
		e.retryAfter = time.Duration(s.Details.RetryAfterSeconds) * time.Second
		for _, c := range s.Details.Causes {
			e.causes = append(e.causes, c.Reason)
		}
	}
	return e
}

// Bounds on an error response: the bytes of its body read to decode it; the
// bytes read past that and discarded, so that the connection can be
// reused; and the bytes of its message kept in the error, since a proxy's
// 1 MiB error page would otherwise be a 1 MiB error and log line.
const (
	maxErrorBody    = 64 << 10
	maxErrorDiscard = 1 << 20
	maxErrorMessage = 1 << 10
)

// readError decodes a failed response's Status body and closes it. A body
// that is not a Status, such as a proxy's error page, is the message, with
// its white space collapsed.
func readError(resp *http.Response, r request) *APIError {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	rest, _ := io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorDiscard))
	var s status
	text := json.Unmarshal(b, &s) != nil || s.Kind != "Status"
	if text {
		s = status{Reason: http.StatusText(resp.StatusCode)}
	}
	e := r.error(s, resp.StatusCode)
	if text {
		e.Message = clip(strings.TrimSpace(string(b)), rest, rest == maxErrorDiscard)
	}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
		e.retryAfter = time.Duration(secs) * time.Second
	}
	return e
}

// clip returns s, a message, with its white space collapsed and cut to
// maxErrorMessage bytes at a rune boundary, saying how many bytes were cut.
// more is the bytes known to follow s, and unread says that others may.
func clip(s string, more int64, unread bool) string {
	i := len(s)
	if i > maxErrorMessage {
		i = maxErrorMessage
		for i > 0 && !utf8.RuneStart(s[i]) {
			i--
		}
	}
	kept := strings.Join(strings.Fields(s[:i]), " ")
	switch cut := int64(len(s)-i) + more; {
	case unread:
		return fmt.Sprintf("%s... (over %d more bytes)", kept, cut)
	case cut > 0:
		return fmt.Sprintf("%s... (%d more bytes)", kept, cut)
	}
	return kept
}
