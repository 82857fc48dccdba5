package charttest

import (
	"fmt"
	"strings"
	"testing"
)

// chartArgsGolden holds the exa container's arguments for every value set
// the tests apply; cmd/exa's TestChartArgsAccepted runs each list through
// the command's flags, so that the chart never renders a combination the
// process refuses at start (a crash-looping pod).
const chartArgsGolden = "../../../cmd/exa/testdata/exa-chart-args.json"

// chartArgs is the exa container's arguments in one value set.
type chartArgs struct {
	Set  string   `json:"set"`
	Args []string `json:"args"`
}

// TestChartArgsGolden: the arguments every applied value set renders are
// those recorded for cmd/exa. EXA_UPDATE_GOLDEN=1 rewrites the file.
func TestChartArgsGolden(t *testing.T) {
	var got []chartArgs
	docs := 0
	for _, set := range appliedSets(t) {
		c, _ := containerAs(t, set.values, set.release)
		// A documented command by its rank, not its line: edits elsewhere
		// on the page leave the file as it is.
		where := set.where
		if file, _, ok := strings.Cut(where, ".md:"); ok {
			docs++
			where = fmt.Sprintf("%s.md, helm install #%d (%s)", strings.TrimPrefix(file, "../../../"), docs, set.release)
		}
		r := chartArgs{Set: where}
		for _, a := range c["args"].([]any) {
			r.Args = append(r.Args, a.(string))
		}
		got = append(got, r)
	}
	checkGolden(t, chartArgsGolden, "the chart", got)
}
