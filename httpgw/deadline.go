package httpgw

import "time"

// aLongTimeAgo is a deadline in the past: it interrupts a pending read
// (or write) on a connection.
var aLongTimeAgo = time.Unix(1, 0)
