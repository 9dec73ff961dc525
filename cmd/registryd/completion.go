package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// completionShells are the shells `registryd completion` writes for.
var completionShells = []string{"bash", "zsh", "fish"}

// commandTree is the command table as completion sees it: the first
// words, each command's second words, and each command's flags.
type commandTree struct {
	first []string
	subs  map[string][]string
	flags map[string][]*flag.Flag // by command name
}

func buildTree() commandTree {
	t := commandTree{subs: map[string][]string{}, flags: map[string][]*flag.Flag{}}
	for _, c := range commands {
		words := strings.Fields(c.name)
		if !slices.Contains(t.first, words[0]) {
			t.first = append(t.first, words[0])
		}
		if len(words) == 2 {
			t.subs[words[0]] = append(t.subs[words[0]], words[1])
		}
		var fl []*flag.Flag
		if c.flags != nil {
			c.flags().VisitAll(func(f *flag.Flag) { fl = append(fl, f) })
		}
		t.flags[c.name] = fl
	}
	return t
}

// flagWords are a command's flags as typed, --help included.
func (t commandTree) flagWords(name string) string {
	var w []string
	for _, f := range t.flags[name] {
		w = append(w, dashes(f.Name)+f.Name)
	}
	return strings.Join(append(w, "--help"), " ")
}

// dashes is how a flag is typed: -o, --output.
func dashes(name string) string {
	if len(name) == 1 {
		return "-"
	}
	return "--"
}

// roleValues are the roles --role takes, by command: a token is minted
// for any role but system, which audit entries can name.
var roleValues = map[string]string{
	"token":      "admin scheduler agent reader",
	"audit list": "admin scheduler agent reader system",
}

// stateNames are the node states --state takes.
func stateNames() []string {
	out := make([]string, len(nodeStates))
	for i, st := range nodeStates {
		out[i] = string(st)
	}
	return out
}

// flagValues are the values completed after command cmd's flag f, where
// they are few; "" where they are not.
func flagValues(cmd string, f *flag.Flag) string {
	switch f.Name {
	case "o", "output":
		// outputFlag's usage of --output lists the formats the command
		// takes (-o is short for it).
		c, _ := findCommand(cmd)
		if out := c.flags().Lookup("output"); out != nil {
			_, formats, _ := strings.Cut(out.Usage, "`FORMAT`: ")
			return strings.ReplaceAll(formats, ", ", " ")
		}
		return ""
	case "state":
		return strings.Join(stateNames(), " ")
	case "sort-by":
		return strings.Join(sortKeyWords, " ")
	case "role":
		return roleValues[cmd]
	case "target-type":
		return "node hardware token"
	}
	return ""
}

// valueCase is one flag of one command whose values are completed: the
// shell case pattern that matches "WORD1 WORD2|PREVIOUS" for it.
type valueCase struct {
	pattern, values string
	oneWord         bool // a one-word command's: its pattern ends in *
}

// valueCases are the cases of every command's flags with values, the
// two-word commands' first (token revoke before token *).
func (t commandTree) valueCases() []valueCase {
	var out []valueCase
	for _, c := range commands {
		for _, f := range t.flags[c.name] {
			v := flagValues(c.name, f)
			if v == "" {
				continue
			}
			vc := valueCase{pattern: strconv.Quote(c.name + "|" + dashes(f.Name) + f.Name), values: v}
			if !strings.Contains(c.name, " ") {
				vc.pattern = strconv.Quote(c.name+" ") + "*" + strconv.Quote("|"+dashes(f.Name)+f.Name)
				vc.oneWord = true
			}
			out = append(out, vc)
		}
	}
	slices.SortStableFunc(out, func(a, b valueCase) int {
		switch {
		case a.oneWord == b.oneWord:
			return 0
		case a.oneWord:
			return 1
		}
		return -1
	})
	return out
}

func completionFlags() *flag.FlagSet { return newFlagSet("completion") }

// completionCmd is `registryd completion bash|zsh|fish`: a script that
// completes commands, subcommands, flags and the values of a few flags.
func completionCmd(_ context.Context, e *cliEnv, c command, args []string) error {
	rest, err := parseArgs(e, c, completionFlags(), args)
	if err != nil {
		return err
	}
	if len(rest) != 1 || !slices.Contains(completionShells, rest[0]) {
		return usageError(e.stderr, c, errors.New("name the shell: bash, zsh or fish"))
	}
	t := buildTree()
	switch rest[0] {
	case "bash":
		fmt.Fprint(e.stdout, bashCompletion(t))
	case "zsh":
		fmt.Fprint(e.stdout, zshCompletion(t))
	default:
		fmt.Fprint(e.stdout, fishCompletion(t))
	}
	return nil
}

func bashCompletion(t commandTree) string {
	var b strings.Builder
	b.WriteString(`# bash completion for registryd: source <(registryd completion bash)
_registryd() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local w=""
    case "${COMP_WORDS[1]} ${COMP_WORDS[2]}|$prev" in
`)
	for _, v := range t.valueCases() {
		fmt.Fprintf(&b, "        %s) COMPREPLY=($(compgen -W %q -- \"$cur\")); return ;;\n", v.pattern, v.values)
	}
	b.WriteString(`        "config use-context|"*) [ "$COMP_CWORD" -eq 3 ] || return
            # Names read as lines, never expanded by the shell (compgen -W would).
            local n; COMPREPLY=(); while IFS= read -r n; do [[ $n == "$cur"* ]] && COMPREPLY+=("$n"); done < <(registryd config get-contexts -o name 2>/dev/null)
            return ;;
`)
	fmt.Fprintf(&b, `    esac
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W %q -- "$cur")); return
    fi
    case "${COMP_WORDS[1]} ${COMP_WORDS[2]}" in
`, strings.Join(t.first, " "))
	for _, c := range commands {
		if strings.Contains(c.name, " ") {
			fmt.Fprintf(&b, "        %q) w=%q ;;\n", c.name, t.flagWords(c.name))
		}
	}
	b.WriteString("        *) case \"${COMP_WORDS[1]}\" in\n")
	for _, first := range t.first {
		w := t.flagWords(first)
		if subs := t.subs[first]; len(subs) > 0 {
			fmt.Fprintf(&b, "            %s) if [ \"$COMP_CWORD\" -eq 2 ]; then w=%q; else w=%q; fi ;;\n", first, strings.Join(subs, " ")+" "+w, w)
			continue
		}
		fmt.Fprintf(&b, "            %s) w=%q ;;\n", first, w)
	}
	b.WriteString(`            esac ;;
    esac
    COMPREPLY=($(compgen -W "$w" -- "$cur"))
}
complete -F _registryd registryd
`)
	return b.String()
}

func zshCompletion(t commandTree) string {
	var b strings.Builder
	b.WriteString(`#compdef registryd
# zsh completion for registryd: source <(registryd completion zsh), or save
# it as _registryd in a folder of $fpath.
_registryd() {
    local -a w
    case "${words[2]} ${words[3]}|${words[CURRENT-1]}" in
`)
	for _, v := range t.valueCases() {
		fmt.Fprintf(&b, "        %s) compadd -- %s; return ;;\n", v.pattern, v.values)
	}
	b.WriteString(`        "config use-context|"*) (( CURRENT == 4 )) && compadd -- ${(f)"$(registryd config get-contexts -o name 2>/dev/null)"}; return ;;
`)
	fmt.Fprintf(&b, `    esac
    if (( CURRENT == 2 )); then
        compadd -- %s; return
    fi
    case "${words[2]} ${words[3]}" in
`, strings.Join(t.first, " "))
	for _, c := range commands {
		if strings.Contains(c.name, " ") {
			fmt.Fprintf(&b, "        %q) w=(%s) ;;\n", c.name, t.flagWords(c.name))
		}
	}
	b.WriteString("        *) case \"${words[2]}\" in\n")
	for _, first := range t.first {
		w := t.flagWords(first)
		if subs := t.subs[first]; len(subs) > 0 {
			fmt.Fprintf(&b, "            %s) if (( CURRENT == 3 )); then w=(%s %s); else w=(%s); fi ;;\n", first, strings.Join(subs, " "), w, w)
			continue
		}
		fmt.Fprintf(&b, "            %s) w=(%s) ;;\n", first, w)
	}
	b.WriteString(`            esac ;;
    esac
    compadd -- $w
}
if [ "$funcstack[1]" = "_registryd" ]; then
    _registryd "$@"
else
    compdef _registryd registryd
fi
`)
	return b.String()
}

// fishQuote is s in fish's single quotes.
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

func fishCompletion(t commandTree) string {
	var b strings.Builder
	b.WriteString("# fish completion for registryd: registryd completion fish | source\n")
	b.WriteString("complete -c registryd -f\n")
	for _, c := range commands {
		words := strings.Fields(c.name)
		if len(words) == 1 {
			fmt.Fprintf(&b, "complete -c registryd -n __fish_use_subcommand -a %s -d %s\n", words[0], fishQuote(c.summary))
		}
	}
	for _, first := range t.first {
		subs := t.subs[first]
		if len(subs) == 0 {
			continue
		}
		cond := fmt.Sprintf("__fish_seen_subcommand_from %s; and not __fish_seen_subcommand_from %s", first, strings.Join(subs, " "))
		for _, s := range subs {
			c, _ := findCommand(first + " " + s)
			fmt.Fprintf(&b, "complete -c registryd -n %s -a %s -d %s\n", fishQuote(cond), s, fishQuote(firstLine(c)))
		}
	}
	b.WriteString("complete -c registryd -n '__fish_seen_subcommand_from config; and __fish_seen_subcommand_from use-context' -a '(registryd config get-contexts -o name 2>/dev/null)'\n")
	for _, c := range commands {
		words := strings.Fields(c.name)
		cond := "__fish_seen_subcommand_from " + words[0]
		if len(words) == 2 {
			cond += "; and __fish_seen_subcommand_from " + words[1]
		}
		for _, f := range t.flags[c.name] {
			desc, _, _ := strings.Cut(f.Usage, ":")
			opt := "-l"
			if len(f.Name) == 1 {
				opt = "-s"
			}
			line := fmt.Sprintf("complete -c registryd -n %s %s %s -d %s", fishQuote(cond), opt, f.Name, fishQuote(strings.ReplaceAll(desc, "`", "")))
			if v := flagValues(c.name, f); v != "" {
				line += " -x -a " + fishQuote(v)
			}
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// firstLine is a command's summary, or the first line of its about.
func firstLine(c command) string {
	if c.summary != "" {
		return c.summary
	}
	line, _, _ := strings.Cut(c.about, "\n")
	return line
}
