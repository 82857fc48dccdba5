package picker

import (
	"fmt"
	"net/netip"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Metadata namespaces and keys of the endpoint picker protocol (GIE
// docs/proposals/004-endpoint-picker-protocol; the same constants are in
// GIE v1.5.0 pkg/epp/metadata/consts.go).
const (
	// SubsetNamespace and SubsetKey locate the subset hint in the filter
	// metadata Envoy sends with a request.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// DestinationNamespace and DestinationKey locate the chosen endpoint
	// in the dynamic metadata the picker returns; DestinationKey is also
	// the request header the picker sets.
	DestinationNamespace = "envoy.lb"
	DestinationKey       = "x-gateway-destination-endpoint"
	// ServedKey, in DestinationNamespace, is where the data plane reports
	// the endpoint that served the request, in the response phase.
	ServedKey = "x-gateway-destination-endpoint-served"
)

// Subset is the set of endpoints a subset hint allows: each entry is
// "ip:port", or a bare "ip" allowing any port at that address, in netip's
// canonical form. A nil Subset allows every endpoint; an empty non-nil one
// allows none.
type Subset []string

// Allows reports whether endpoint ("ip:port") is in the subset. A nil
// Subset allows every endpoint; an endpoint that is not ip:port is allowed
// only by a nil Subset.
func (s Subset) Allows(endpoint string) bool {
	if s == nil {
		return true
	}
	ep, err := netip.ParseAddrPort(endpoint)
	if err != nil {
		return false
	}
	for _, e := range s {
		if ap, err := netip.ParseAddrPort(e); err == nil {
			if ap == ep {
				return true
			}
		} else if a, err := netip.ParseAddr(e); err == nil && a == ep.Addr() {
			return true
		}
	}
	return false
}

// parseSubsetHint reads the subset hint from a request's metadata, appending
// its entries to dst[:0]. present is false when md carries no hint (the
// namespace or the key is absent, or the value is null): every endpoint is
// allowed. A hint that is present but allows nothing — an empty list or
// string, entries none of which is an address, or a value that is neither a
// list nor a string — returns an error wrapping ErrNoEndpoint that names
// the key and the value; the protocol answers it with 503.
//
// The value is a list of strings or one comma-separated string; each string
// may itself hold several comma-separated entries. An entry is "ip:port" or
// "ip"; entries that are neither, and list elements that are not strings,
// can never be eligible and are skipped, as GIE v1.5.0 skips non-string
// elements (pkg/epp/requestcontrol/candidates.go). GIE ignores a hint of
// another type and picks from the whole pool; this picker refuses it, since
// picking outside a subset the data plane asked for is what the protocol
// calls unpredictable.
func parseSubsetHint(md *corev3.Metadata, dst Subset) (s Subset, present bool, err error) {
	ns := md.GetFilterMetadata()[SubsetNamespace]
	if ns == nil {
		return nil, false, nil
	}
	v, ok := ns.GetFields()[SubsetKey]
	if !ok || v == nil {
		return nil, false, nil
	}
	s = dst[:0]
	var firstBad string
	addEntries := func(str string) {
		for str != "" {
			var e string
			e, str, _ = strings.Cut(str, ",")
			e = strings.TrimSpace(e)
			if e == "" {
				continue
			}
			if n, ok := normalizeEntry(e); ok {
				s = append(s, n)
			} else if firstBad == "" {
				firstBad = fmt.Sprintf("%q", e)
			}
		}
	}
	switch k := v.GetKind().(type) {
	case nil, *structpb.Value_NullValue:
		return nil, false, nil
	case *structpb.Value_StringValue:
		addEntries(k.StringValue)
	case *structpb.Value_ListValue:
		for i, el := range k.ListValue.GetValues() {
			if str, ok := el.GetKind().(*structpb.Value_StringValue); ok {
				addEntries(str.StringValue)
			} else if firstBad == "" {
				firstBad = fmt.Sprintf("element %d, a %s", i, kindName(el))
			}
		}
	default:
		return nil, true, fmt.Errorf("%w: metadata %s/%s is a %s, want a list of \"ip:port\" strings or a comma-separated string",
			ErrNoEndpoint, SubsetNamespace, SubsetKey, kindName(v))
	}
	if len(s) == 0 {
		if firstBad != "" {
			return s, true, fmt.Errorf("%w: metadata %s/%s holds no \"ip:port\" endpoint (first bad entry: %s)",
				ErrNoEndpoint, SubsetNamespace, SubsetKey, firstBad)
		}
		return s, true, fmt.Errorf("%w: metadata %s/%s is empty", ErrNoEndpoint, SubsetNamespace, SubsetKey)
	}
	return s, true, nil
}

// normalizeEntry returns a subset entry in canonical form: "ip:port" or
// "ip". Hostnames are not endpoints.
func normalizeEntry(e string) (string, bool) {
	if ap, err := netip.ParseAddrPort(e); err == nil {
		return ap.String(), true
	}
	if a, err := netip.ParseAddr(e); err == nil {
		return a.String(), true
	}
	return "", false
}

// kindName names a structpb value's kind for error messages.
func kindName(v *structpb.Value) string {
	switch v.GetKind().(type) {
	case *structpb.Value_NumberValue:
		return "number"
	case *structpb.Value_BoolValue:
		return "bool"
	case *structpb.Value_StructValue:
		return "struct"
	case *structpb.Value_ListValue:
		return "list"
	case *structpb.Value_StringValue:
		return "string"
	case *structpb.Value_NullValue:
		return "null"
	}
	return "value of no kind"
}

// servedEndpoint returns the endpoint the data plane reports as having
// served the request (envoy.lb / x-gateway-destination-endpoint-served), or
// "" if md does not say. A list value gives its first string.
func servedEndpoint(md *corev3.Metadata) string {
	ns := md.GetFilterMetadata()[DestinationNamespace]
	if ns == nil {
		return ""
	}
	v := ns.GetFields()[ServedKey]
	if l := v.GetListValue(); l != nil && len(l.GetValues()) > 0 {
		v = l.GetValues()[0]
	}
	return v.GetStringValue()
}
