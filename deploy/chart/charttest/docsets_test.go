package charttest

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/strvals"
)

// docFiles are the pages whose `helm install … deploy/chart/exa` commands
// the tests render and apply, each as it is written.
var docFiles = []string{"../../../docs/kubernetes.md"}

// docSet is one documented `helm install` command: its release, and the
// values its --set, --set-string and --set-json flags give.
type docSet struct {
	where   string // file:line
	release string
	values  map[string]any
}

// docSets reads every `helm install RELEASE deploy/chart/exa …` command
// (backslash continuations joined) from docFiles.
func docSets(t *testing.T) []docSet {
	t.Helper()
	var sets []docSet
	for _, file := range docFiles {
		f, err := os.Open(file)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		n, start, cmd := 0, 0, ""
		for sc.Scan() {
			n++
			line := strings.TrimSpace(sc.Text())
			if cmd == "" && !strings.HasPrefix(line, "helm install ") {
				continue
			}
			if cmd == "" {
				start = n
			}
			cont := strings.HasSuffix(line, `\`)
			cmd += " " + strings.TrimSuffix(line, `\`)
			if cont {
				continue
			}
			set, err := parseHelmInstall(cmd)
			require.NoError(t, err, "%s:%d: %s", file, start, cmd)
			set.where = fmt.Sprintf("%s:%d", file, start)
			sets = append(sets, set)
			cmd = ""
		}
		require.NoError(t, sc.Err())
		f.Close()
	}
	require.NotEmpty(t, sets, "no `helm install` command in %v", docFiles)
	return sets
}

// parseHelmInstall parses `helm install RELEASE CHART [flags]` as Helm
// does its --set, --set-string and --set-json flags; -n/--namespace is
// ignored (each set gets a namespace of its own), any other flag is an
// error so that a new one in the docs is not silently skipped.
func parseHelmInstall(cmd string) (docSet, error) {
	w, err := shellWords(cmd)
	if err != nil {
		return docSet{}, err
	}
	if len(w) < 4 || w[0] != "helm" || w[1] != "install" {
		return docSet{}, fmt.Errorf("want helm install RELEASE CHART, got %q", w)
	}
	if w[3] != "deploy/chart/exa" {
		return docSet{}, fmt.Errorf("chart %q: want deploy/chart/exa", w[3])
	}
	s := docSet{release: w[2], values: map[string]any{}}
	for i := 4; i < len(w); i++ {
		flag, val, ok := strings.Cut(w[i], "=")
		if !ok {
			if i+1 >= len(w) {
				return s, fmt.Errorf("flag %s without a value", flag)
			}
			i++
			val = w[i]
		}
		switch flag {
		case "-n", "--namespace":
		case "--set":
			err = strvals.ParseInto(val, s.values)
		case "--set-string":
			err = strvals.ParseIntoString(val, s.values)
		case "--set-json":
			err = strvals.ParseJSON(val, s.values)
		default:
			err = fmt.Errorf("flag %s: the test does not read it", flag)
		}
		if err != nil {
			return s, fmt.Errorf("%s %s: %w", flag, val, err)
		}
	}
	return s, nil
}

// shellWords splits a command line as a POSIX shell would for words
// with single and double quotes (no expansions).
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	in, quote := false, rune(0)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote in %q", quote, s)
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

func TestShellWords(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []string
	}{
		{`helm install a b`, []string{"helm", "install", "a", "b"}},
		{` --set 'x={1,2}'  --set-json 'r={"a": 1}' `, []string{"--set", "x={1,2}", "--set-json", `r={"a": 1}`}},
		{`a"b c"'d'`, []string{"ab cd"}},
		{`''`, []string{""}},
	} {
		got, err := shellWords(tt.in)
		require.NoError(t, err)
		require.Equal(t, tt.want, got, tt.in)
	}
	_, err := shellWords(`--set 'x`)
	require.ErrorContains(t, err, "unterminated ' quote")
}

// TestChartDocSetsRender renders every applied value set and checks what
// the API server does not: the pod's volumes are mounted side by side
// (a read-only mount cannot hold another's mount point), the probes are
// on the paths docs/gateway.md names, GIE's grace and resource shape, and
// a created InferencePool names an endpoint picker with a failure mode.
func TestChartDocSetsRender(t *testing.T) {
	sets := appliedSets(t)
	require.GreaterOrEqual(t, len(sets), 6)
	sawPool := map[string]bool{}
	for _, set := range sets {
		objs := map[string]map[string]any{}
		for _, o := range objects(t, renderAs(t, set.values, set.release, "llm")) {
			objs[o.GetKind()] = o.Object
		}
		pod := objs["Deployment"]["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		require.EqualValues(t, 130, pod["terminationGracePeriodSeconds"], set.where)
		c := pod["containers"].([]any)[0].(map[string]any)
		require.Contains(t, c["args"], "--shutdown-grace=120s", set.where)
		res := c["resources"].(map[string]any)
		require.Contains(t, res["requests"], "cpu", set.where)
		require.Contains(t, res["requests"], "memory", set.where)
		require.Contains(t, res["limits"], "memory", set.where)
		require.NotContains(t, res["limits"], "cpu", set.where)
		var paths []string
		for _, m := range c["volumeMounts"].([]any) {
			paths = append(paths, m.(map[string]any)["mountPath"].(string))
		}
		for _, a := range paths {
			for _, b := range paths {
				require.False(t, a != b && strings.HasPrefix(b, a+"/"), "%s: %s mounted inside %s", set.where, b, a)
			}
		}
		mode := c["args"].([]any)[1].(string)
		if mode == "gateway" {
			require.Equal(t, "/health", c["readinessProbe"].(map[string]any)["httpGet"].(map[string]any)["path"], set.where)
			require.Equal(t, "/healthz", c["livenessProbe"].(map[string]any)["httpGet"].(map[string]any)["path"], set.where)
		} else {
			require.Equal(t, "readiness", c["readinessProbe"].(map[string]any)["grpc"].(map[string]any)["service"], set.where)
		}
		if p, ok := objs["InferencePool"]; ok {
			sawPool[mode] = true
			ref, ok := p["spec"].(map[string]any)["endpointPickerRef"].(map[string]any)
			require.True(t, ok, "%s: InferencePool without endpointPickerRef", set.where)
			require.NotEmpty(t, ref["name"], set.where)
			require.Equal(t, "FailOpen", ref["failureMode"], set.where)
		}
	}
	// Both modes' pool.create are among the documented sets.
	require.Equal(t, map[string]bool{"picker": true, "gateway": true}, sawPool)
}
