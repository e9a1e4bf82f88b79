// chart-render renders a Helm chart the way `helm template` does, from the same parts Helm is made of: Go's
// text/template, the sprig function library, and sigs.k8s.io/yaml for values, toYaml and fromYaml. CI cannot run
// Helm or a Kubernetes API server, so the chart tests render with this and validate what comes out.
//
// It implements the part of Helm the charts of this repository use, and fails loudly on anything else:
//
//   - Chart.yaml and values.yaml, coalesced with -f/--values files and --set/--set-string (later wins, maps merge,
//     null deletes a key), then checked against values.schema.json when the chart has one (xeipuuv/gojsonschema,
//     the validator Helm 3 uses, with Helm's error message);
//   - .Values, .Chart (the Chart.yaml metadata with Helm's field names), .Release (Name, Namespace, Service,
//     IsInstall, IsUpgrade, Revision), .Capabilities (KubeVersion, APIVersions.Has), .Template (Name, BasePath) and
//     .Files (Get, GetBytes, Glob, Lines, AsConfig, AsSecrets) over the chart's non-template files;
//   - sprig's functions minus env/expandenv, plus Helm's include, tpl, required, toYaml, fromYaml, fromYamlArray,
//     toJson, fromJson, fromJsonArray and lookup (which, as in `helm template`, finds nothing);
//   - every template under templates/ parsed into one template set; files whose name starts with `_` are partials,
//     NOTES.txt is skipped; "missingkey=zero" and the removal of "<no value>" exactly as Helm's engine does;
//   - output: the `helm template` stream ("---\n# Source: <chart>/templates/<file>\n<document>") or, with
//     --output json, one JSON object per line {"source","index","object"} converted with sigs.k8s.io/yaml the way
//     kubectl converts manifests, so that what the tests see is what the API server would see.
//
// --to-json FILE... converts plain YAML manifests (examples, CRDs) to the same JSON lines without rendering.
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"github.com/xeipuuv/gojsonschema"
	"sigs.k8s.io/yaml"
)

// Metadata is Chart.yaml, with the field names Helm gives .Chart.
type Metadata struct {
	Name         string            `json:"name,omitempty"`
	Home         string            `json:"home,omitempty"`
	Sources      []string          `json:"sources,omitempty"`
	Version      string            `json:"version,omitempty"`
	Description  string            `json:"description,omitempty"`
	Keywords     []string          `json:"keywords,omitempty"`
	Maintainers  []interface{}     `json:"maintainers,omitempty"`
	Icon         string            `json:"icon,omitempty"`
	APIVersion   string            `json:"apiVersion,omitempty"`
	Condition    string            `json:"condition,omitempty"`
	Tags         string            `json:"tags,omitempty"`
	AppVersion   string            `json:"appVersion,omitempty"`
	Deprecated   bool              `json:"deprecated,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	KubeVersion  string            `json:"kubeVersion,omitempty"`
	Dependencies []interface{}     `json:"dependencies,omitempty"`
	Type         string            `json:"type,omitempty"`
}

// Files is .Files: the chart's files outside templates/, by slash-separated path.
type Files map[string][]byte

// Get returns a file's content, or "" when there is no such file (as Helm does).
func (f Files) Get(name string) string { return string(f[name]) }

// GetBytes returns a file's content as bytes.
func (f Files) GetBytes(name string) []byte { return f[name] }

// Glob returns the files whose path matches the pattern (`*` within a segment, `**` across segments).
func (f Files) Glob(pattern string) Files {
	re := globRegexp(pattern)
	out := Files{}
	for name, data := range f {
		if re.MatchString(name) {
			out[name] = data
		}
	}
	return out
}

// Lines returns a file's lines.
func (f Files) Lines(name string) []string {
	data, ok := f[name]
	if !ok {
		return []string{}
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

// AsConfig renders the files as ConfigMap data: base name to content, as YAML.
func (f Files) AsConfig() string {
	m := map[string]string{}
	for name, data := range f {
		m[path.Base(name)] = string(data)
	}
	return toYAML(m)
}

// AsSecrets renders the files as Secret data: base name to base64 content, as YAML.
func (f Files) AsSecrets() string {
	m := map[string]string{}
	for name, data := range f {
		m[path.Base(name)] = base64.StdEncoding.EncodeToString(data)
	}
	return toYAML(m)
}

func globRegexp(pattern string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		switch {
		case c == '*' && i+1 < len(pattern) && pattern[i+1] == '*':
			b.WriteString(".*")
			i++
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// VersionSet is .Capabilities.APIVersions.
type VersionSet []string

// Has reports whether an API version (group/version or group/version/Kind) is known.
func (v VersionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

// KubeVersion is .Capabilities.KubeVersion.
type KubeVersion struct {
	Version    string
	Major      string
	Minor      string
	GitVersion string
}

// String is what `{{ .Capabilities.KubeVersion }}` prints.
func (k KubeVersion) String() string { return k.Version }

// Capabilities is .Capabilities.
type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions VersionSet
}

func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromYAMLArray(str string) []interface{} {
	a := []interface{}{}
	if err := yaml.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromJSONArray(str string) []interface{} {
	a := []interface{}{}
	if err := json.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func required(warn string, val interface{}) (interface{}, error) {
	if val == nil {
		return val, errors.New(warn)
	}
	if s, ok := val.(string); ok && s == "" {
		return val, errors.New(warn)
	}
	return val, nil
}

// Chart is a loaded chart directory.
type Chart struct {
	Dir       string
	Meta      Metadata
	Schema    []byte
	Values    map[string]interface{}
	Templates map[string]string // "<chart>/templates/<rel>" -> source
	Files     Files
}

func loadChart(dir string) (*Chart, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	c := &Chart{Dir: dir, Templates: map[string]string{}, Files: Files{}}
	if err := yaml.UnmarshalStrict(raw, &c.Meta); err != nil {
		return nil, fmt.Errorf("Chart.yaml: %w", err)
	}
	if c.Meta.Name == "" || c.Meta.Version == "" {
		return nil, errors.New("Chart.yaml: name and version are required")
	}
	c.Values = map[string]interface{}{}
	if raw, err := os.ReadFile(filepath.Join(dir, "values.yaml")); err == nil {
		if err := yaml.Unmarshal(raw, &c.Values); err != nil {
			return nil, fmt.Errorf("values.yaml: %w", err)
		}
		if c.Values == nil {
			c.Values = map[string]interface{}{}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	ignore := helmIgnore(dir)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		if ignore(rel, d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(rel, "templates/"):
			c.Templates[c.Meta.Name+"/"+rel] = string(data)
		case rel == "values.schema.json":
			c.Schema = data
		case rel == "Chart.yaml" || rel == "values.yaml":
		default:
			c.Files[rel] = data
		}
		return nil
	})
	return c, err
}

// helmIgnore reads .helmignore's simple patterns (one per line; a trailing / matches directories only).
func helmIgnore(dir string) func(rel string, isDir bool) bool {
	var patterns []string
	if raw, err := os.ReadFile(filepath.Join(dir, ".helmignore")); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			line = strings.TrimSpace(line)
			if line != "" && !strings.HasPrefix(line, "#") {
				patterns = append(patterns, line)
			}
		}
	}
	return func(rel string, isDir bool) bool {
		if rel == ".helmignore" {
			return true
		}
		for _, p := range patterns {
			dirOnly := strings.HasSuffix(p, "/")
			p = strings.TrimSuffix(p, "/")
			if dirOnly && !isDir {
				continue
			}
			if ok, _ := path.Match(p, rel); ok {
				return true
			}
			if ok, _ := path.Match(p, path.Base(rel)); ok {
				return true
			}
		}
		return false
	}
}

// coalesce merges src into dst: maps merge recursively, anything else replaces, null deletes.
func coalesce(dst, src map[string]interface{}) map[string]interface{} {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		if sm, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				dst[k] = coalesce(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
	return dst
}

// setValue applies one --set / --set-string assignment: `a.b.c=value`, with Helm's scalar typing unless asString.
func setValue(values map[string]interface{}, assignment string, asString bool) error {
	eq := strings.Index(assignment, "=")
	if eq <= 0 {
		return fmt.Errorf("--set %q: expected key=value", assignment)
	}
	keys := strings.Split(assignment[:eq], ".")
	raw := assignment[eq+1:]
	var val interface{} = raw
	if !asString {
		switch {
		case raw == "true":
			val = true
		case raw == "false":
			val = false
		case raw == "null":
			val = nil
		default:
			if i, err := strconv.ParseInt(raw, 10, 64); err == nil && (raw == "0" || !strings.HasPrefix(raw, "0")) {
				val = i
			}
		}
	}
	m := values
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]interface{})
		if !ok {
			next = map[string]interface{}{}
			m[k] = next
		}
		m = next
	}
	last := keys[len(keys)-1]
	if val == nil {
		delete(m, last)
	} else {
		m[last] = val
	}
	return nil
}

// validateValues checks the final values against the chart's values.schema.json, as Helm does before rendering.
func validateValues(c *Chart, values map[string]interface{}) error {
	if len(c.Schema) == 0 {
		return nil
	}
	doc, err := json.Marshal(values)
	if err != nil {
		return err
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(c.Schema), gojsonschema.NewBytesLoader(doc))
	if err != nil {
		return fmt.Errorf("%s: values.schema.json: %w", c.Meta.Name, err)
	}
	if result.Valid() {
		return nil
	}
	var b strings.Builder
	for _, e := range result.Errors() {
		fmt.Fprintf(&b, "- %s\n", e)
	}
	return fmt.Errorf("values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n%s", c.Meta.Name, b.String())
}

// Engine renders one chart's templates.
type Engine struct {
	chart *Chart
	tmpl  *template.Template
}

func newEngine(c *Chart) (*Engine, error) {
	e := &Engine{chart: c}
	t := template.New("gotpl").Option("missingkey=zero")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	includedNames := map[string]int{}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		if includedNames[name] > 1000 {
			return "", fmt.Errorf("rendering template has a nested reference name: %s", name)
		}
		includedNames[name]++
		defer func() { includedNames[name]-- }()
		var buf strings.Builder
		err := e.tmpl.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, vals interface{}) (string, error) {
		clone, err := e.tmpl.Clone()
		if err != nil {
			return "", err
		}
		name := "tpl"
		if m, ok := vals.(map[string]interface{}); ok {
			if tm, ok := m["Template"].(map[string]interface{}); ok {
				if n, ok := tm["Name"].(string); ok {
					name = n
				}
			}
		}
		if _, err := clone.New(name).Parse(text); err != nil {
			return "", fmt.Errorf("cannot parse template %q: %w", text, err)
		}
		var buf strings.Builder
		if err := clone.ExecuteTemplate(&buf, name, vals); err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %w", text, err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	funcs["required"] = required
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = fromYAML
	funcs["fromYamlArray"] = fromYAMLArray
	funcs["toJson"] = toJSON
	funcs["fromJson"] = fromJSON
	funcs["fromJsonArray"] = fromJSONArray
	funcs["lookup"] = func(apiVersion, kind, namespace, name string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	t.Funcs(funcs)
	// Parse deeper paths first, as Helm does, so that a chart's own definitions win over same-named ones.
	names := make([]string, 0, len(c.Templates))
	for name := range c.Templates {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		di, dj := strings.Count(names[i], "/"), strings.Count(names[j], "/")
		if di != dj {
			return di > dj
		}
		return names[i] > names[j]
	})
	for _, name := range names {
		if _, err := t.New(name).Parse(c.Templates[name]); err != nil {
			return nil, fmt.Errorf("parse error in %s: %w", name, err)
		}
	}
	e.tmpl = t
	return e, nil
}

// Rendered is one template file's output.
type Rendered struct {
	Source  string
	Content string
}

func (e *Engine) render(values map[string]interface{}, release map[string]interface{}, caps Capabilities) ([]Rendered, error) {
	names := make([]string, 0)
	for name := range e.chart.Templates {
		base := path.Base(name)
		if strings.HasPrefix(base, "_") || base == "NOTES.txt" {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	out := make([]Rendered, 0, len(names))
	for _, name := range names {
		top := map[string]interface{}{
			"Values":       values,
			"Chart":        &e.chart.Meta,
			"Release":      release,
			"Capabilities": &caps,
			"Files":        e.chart.Files,
			"Template": map[string]interface{}{
				"Name":     name,
				"BasePath": e.chart.Meta.Name + "/templates",
			},
		}
		var buf bytes.Buffer
		if err := e.tmpl.ExecuteTemplate(&buf, name, top); err != nil {
			return nil, cleanupExecError(name, err)
		}
		out = append(out, Rendered{Source: name, Content: strings.ReplaceAll(buf.String(), "<no value>", "")})
	}
	return out, nil
}

// cleanupExecError shortens text/template's error the way Helm does: "execution error at (<file>:l:c): <msg>".
func cleanupExecError(name string, err error) error {
	var execErr template.ExecError
	if errors.As(err, &execErr) {
		re := regexp.MustCompile(`^template: (.*?): executing ".*?" at <.*?>: error calling \w+: (.*)$`)
		if m := re.FindStringSubmatch(execErr.Err.Error()); m != nil {
			return fmt.Errorf("execution error at (%s): %s", m[1], m[2])
		}
	}
	return fmt.Errorf("%s: %w", name, err)
}

var docSep = regexp.MustCompile(`(?:^|\s*\n)---\s*`)

// splitManifests splits a rendered file into documents like Helm's releaseutil.SplitManifests.
func splitManifests(content string) []string {
	var docs []string
	for _, d := range docSep.Split(content, -1) {
		if strings.TrimSpace(d) == "" {
			continue
		}
		docs = append(docs, strings.TrimSpace(d))
	}
	return docs
}

type jsonLine struct {
	Source string          `json:"source"`
	Index  int             `json:"index"`
	Object json.RawMessage `json:"object"`
}

func emitJSON(w *bytes.Buffer, source string, docs []string) error {
	index := 0
	for _, doc := range docs {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return fmt.Errorf("%s: document %d is not valid YAML: %w\n%s", source, index, err, doc)
		}
		if string(bytes.TrimSpace(j)) == "null" {
			continue // only comments
		}
		line, err := json.Marshal(jsonLine{Source: source, Index: index, Object: j})
		if err != nil {
			return err
		}
		w.Write(line)
		w.WriteByte('\n')
		index++
	}
	return nil
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fl := flag.NewFlagSet("chart-render", flag.ContinueOnError)
	var valueFiles, sets, setStrings multiFlag
	fl.Var(&valueFiles, "f", "values file (repeatable)")
	fl.Var(&valueFiles, "values", "values file (repeatable)")
	fl.Var(&sets, "set", "key=value (repeatable)")
	fl.Var(&setStrings, "set-string", "key=value, value kept a string (repeatable)")
	name := fl.String("name", "release-name", "release name")
	namespace := fl.String("namespace", "default", "release namespace")
	kubeVersion := fl.String("kube-version", "v1.33.0", "Kubernetes version for .Capabilities")
	output := fl.String("output", "yaml", "yaml (the helm template stream) or json (one object per line)")
	toJSONMode := fl.Bool("to-json", false, "convert the given YAML files to JSON lines instead of rendering a chart")
	if err := fl.Parse(args); err != nil {
		return err
	}
	var out bytes.Buffer
	if *toJSONMode {
		for _, file := range fl.Args() {
			raw, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			if err := emitJSON(&out, file, splitManifests(string(raw))); err != nil {
				return err
			}
		}
		_, err := os.Stdout.Write(out.Bytes())
		return err
	}
	if fl.NArg() != 1 {
		return errors.New("usage: chart-render [flags] CHART_DIR | chart-render --to-json FILE...")
	}
	chart, err := loadChart(fl.Arg(0))
	if err != nil {
		return err
	}
	values := chart.Values
	for _, file := range valueFiles {
		raw, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		override := map[string]interface{}{}
		if err := yaml.Unmarshal(raw, &override); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		values = coalesce(values, override)
	}
	for _, s := range sets {
		if err := setValue(values, s, false); err != nil {
			return err
		}
	}
	for _, s := range setStrings {
		if err := setValue(values, s, true); err != nil {
			return err
		}
	}
	if err := validateValues(chart, values); err != nil {
		return err
	}
	release := map[string]interface{}{
		"Name":      *name,
		"Namespace": *namespace,
		"Service":   "Helm",
		"IsInstall": true,
		"IsUpgrade": false,
		"Revision":  1,
	}
	kv := strings.TrimPrefix(*kubeVersion, "v")
	parts := strings.SplitN(kv, ".", 3)
	if len(parts) < 2 {
		return fmt.Errorf("--kube-version %q: expected vMAJOR.MINOR[.PATCH]", *kubeVersion)
	}
	caps := Capabilities{
		KubeVersion: KubeVersion{Version: "v" + kv, Major: parts[0], Minor: parts[1], GitVersion: "v" + kv},
		APIVersions: VersionSet{"v1", "apps/v1", "batch/v1", "rbac.authorization.k8s.io/v1", "policy/v1"},
	}
	engine, err := newEngine(chart)
	if err != nil {
		return err
	}
	rendered, err := engine.render(values, release, caps)
	if err != nil {
		return err
	}
	for _, r := range rendered {
		docs := splitManifests(r.Content)
		switch *output {
		case "yaml":
			for _, d := range docs {
				fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", r.Source, d)
			}
		case "json":
			if err := emitJSON(&out, r.Source, docs); err != nil {
				return err
			}
		default:
			return fmt.Errorf("--output %q: expected yaml or json", *output)
		}
	}
	_, err = os.Stdout.Write(out.Bytes())
	return err
}
