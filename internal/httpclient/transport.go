package httpclient

import (
	"net"
	"net/http"
	"time"
)

// dialTimeout bounds connecting to an engine.
const dialTimeout = 5 * time.Second

// NewTransport returns the http.Transport tuned for engines that a Pool
// falls back to (and that the gateway can use instead of a Pool): pooled
// keep-alive connections (up to 256 idle per engine, kept 90s), no
// compression (bodies pass through as the engine sent them), no proxy
// (engines are addressed directly), HTTP/1.1 only, response heads bounded
// by maxHead bytes (DefaultMaxResponseHeaderBytes if zero or negative).
func NewTransport(maxHead int64) *http.Transport {
	if maxHead <= 0 {
		maxHead = DefaultMaxResponseHeaderBytes
	}
	return &http.Transport{
		Proxy:                  nil,
		DialContext:            (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:           1024,
		MaxIdleConnsPerHost:    DefaultMaxIdlePerHost,
		IdleConnTimeout:        90 * time.Second,
		DisableCompression:     true,
		ForceAttemptHTTP2:      false,
		ExpectContinueTimeout:  0,
		MaxResponseHeaderBytes: maxHead,
	}
}
