// Command lincheck checks a history of operations recorded against a running convplane plane
// for linearizability, with Porcupine (github.com/anishathalye/porcupine).
//
// The model is what the REST API promises per conversation: an append-only log with gapless
// seqs and idempotency keys. The history is partitioned by conversation (a conversation is one
// object; linearizability is compositional, so the whole history is linearizable iff every
// conversation's is):
//
//   - append(key) -> seq: a new key gets the next seq; a key already in the log returns the
//     seq it got first and changes nothing (an Idempotency-Key retry).
//   - append(key) -> unknown: a timeout or 5xx. The entry may or may not commit, so the
//     operation stays open until the end of the history (return = +inf): the checker may
//     place it anywhere after its call, including after everything else (never applied).
//   - read -> [(seq, key)...]: the committed transcript, which must equal the log exactly.
//   - last -> last_seq: GET /v1/conversations/{id}, which must equal the log's last seq.
//   - effect(attempt, status) -> seq | conflict: a tool.effect. The first effect of an attempt
//     is a new entry; an identical one returns the seq of that entry; a different one is a
//     409 effect_conflict and changes nothing (at most one effect per attempt); a 409
//     unknown_attempt says the log holds no such tool.attempt.
//   - status(attempt) -> pending | committed | failed: GET .../tool-attempts/{id}, which must
//     show the effect the log holds (pending while it holds the attempt alone).
//
// In the log and in reads an event is named by its key: a note by the key it carries, a
// tool.attempt "att:<attempt>", a tool.effect "eff:<attempt>:<status>".
//
// Usage: lincheck [-timeout 60s] [-html out.html] history.json
// Prints a JSON summary; exits 0 when linearizable, 1 when not, 2 when the check timed out or
// the input is unusable.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// History is the file the recorder writes.
type History struct {
	// Conversations: id -> last seq right after its creation (before any recorded operation).
	Conversations map[string]int `json:"conversations"`
	Operations    []Recorded     `json:"operations"`
}

// Recorded is one operation as a client saw it. Times are nanoseconds of one monotonic clock.
type Recorded struct {
	Client       int      `json:"client"`
	Conversation string   `json:"conversation"`
	Op           string   `json:"op"` // append | read | last | effect | status
	Key          string   `json:"key,omitempty"`
	Call         int64    `json:"call"`
	Return       *int64   `json:"return"` // null: outcome unknown (appends only)
	Seq          int      `json:"seq,omitempty"`
	Seqs         []int    `json:"seqs,omitempty"`
	Keys         []string `json:"keys,omitempty"`
	LastSeq      int      `json:"last_seq,omitempty"`
	Attempt      string   `json:"attempt,omitempty"`
	Status       string   `json:"status,omitempty"`     // effect: committed | failed
	Conflict     bool     `json:"conflict,omitempty"`   // effect: answered 409 effect_conflict
	NoAttempt    bool     `json:"no_attempt,omitempty"` // effect: answered 409 unknown_attempt
	State        string   `json:"state,omitempty"`      // status: pending | committed | failed
	Region       string   `json:"region,omitempty"`
}

type input struct {
	op      string
	key     string
	attempt string
	status  string
}

type output struct {
	unknown  bool
	seq      int
	seqs     []int
	keys     []string
	lastSeq  int
	conflict bool
	// noAttempt: the effect was refused because the log holds no such attempt
	noAttempt bool
	state     string
}

// state is one conversation's log: the seq before the first recorded append, and the keys in
// seq order joined by "\n" (a comparable value, so Porcupine's memo works on ==).
type state struct {
	base int
	n    int
	keys string
}

func (s state) indexOf(key string) int {
	if s.n == 0 {
		return -1
	}
	for i, k := range strings.Split(s.keys, "\n") {
		if k == key {
			return i
		}
	}
	return -1
}

// effectOf: the index and status of the attempt's effect in the log (-1 when none).
func (s state) effectOf(attempt string) (int, string) {
	if s.n == 0 {
		return -1, ""
	}
	prefix := "eff:" + attempt + ":"
	for i, k := range strings.Split(s.keys, "\n") {
		if strings.HasPrefix(k, prefix) {
			return i, k[len(prefix):]
		}
	}
	return -1, ""
}

func (s state) with(key string) state {
	if s.n == 0 {
		return state{s.base, 1, key}
	}
	return state{s.base, s.n + 1, s.keys + "\n" + key}
}

func (s state) matches(o output) bool {
	if len(o.keys) != s.n || len(o.seqs) != s.n {
		return false
	}
	if s.n == 0 {
		return true
	}
	for i, k := range strings.Split(s.keys, "\n") {
		if o.keys[i] != k || o.seqs[i] != s.base+1+i {
			return false
		}
	}
	return true
}

func step(st interface{}, in interface{}, out interface{}) (bool, interface{}) {
	s, i, o := st.(state), in.(input), out.(output)
	switch i.op {
	case "append":
		if at := s.indexOf(i.key); at >= 0 {
			return o.unknown || o.seq == s.base+1+at, s
		}
		return o.unknown || o.seq == s.base+1+s.n, s.with(i.key)
	case "read":
		return s.matches(o), s
	case "last":
		return o.lastSeq == s.base+s.n, s
	case "effect":
		if o.noAttempt {
			return s.indexOf("att:"+i.attempt) < 0, s
		}
		at, status := s.effectOf(i.attempt)
		switch {
		case at >= 0 && status == i.status: // an identical effect: the original entry
			return o.unknown || (!o.conflict && o.seq == s.base+1+at), s
		case at >= 0: // a different effect is recorded: refused, nothing written
			return o.unknown || o.conflict, s
		}
		if o.conflict {
			return false, s
		}
		return o.unknown || o.seq == s.base+1+s.n, s.with("eff:" + i.attempt + ":" + i.status)
	case "status":
		if s.indexOf("att:"+i.attempt) < 0 {
			return false, s // only acknowledged attempts are asked about
		}
		_, status := s.effectOf(i.attempt)
		if status == "" {
			status = "pending"
		}
		return o.state == status, s
	}
	return false, s
}

func describeOperation(in interface{}, out interface{}) string {
	i, o := in.(input), out.(output)
	switch i.op {
	case "append":
		if o.unknown {
			return fmt.Sprintf("append(%s) -> ?", i.key)
		}
		return fmt.Sprintf("append(%s) -> %d", i.key, o.seq)
	case "read":
		return fmt.Sprintf("read -> %d events", len(o.keys))
	case "effect":
		switch {
		case o.unknown:
			return fmt.Sprintf("effect(%s, %s) -> ?", i.attempt, i.status)
		case o.conflict:
			return fmt.Sprintf("effect(%s, %s) -> 409", i.attempt, i.status)
		case o.noAttempt:
			return fmt.Sprintf("effect(%s, %s) -> 409 no attempt", i.attempt, i.status)
		}
		return fmt.Sprintf("effect(%s, %s) -> %d", i.attempt, i.status, o.seq)
	case "status":
		return fmt.Sprintf("status(%s) -> %s", i.attempt, o.state)
	}
	return fmt.Sprintf("last -> %d", o.lastSeq)
}

func describeState(st interface{}) string {
	s := st.(state)
	return fmt.Sprintf("%d events after seq %d", s.n, s.base)
}

func main() {
	timeout := flag.Duration("timeout", 60*time.Second, "give up (exit 2) after this long")
	htmlPath := flag.String("html", "", "write Porcupine's visualization here when not linearizable")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: lincheck [-timeout D] [-html F] history.json")
		os.Exit(2)
	}
	raw, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		fail(err)
	}
	var h History
	if err := json.Unmarshal(raw, &h); err != nil {
		fail(err)
	}
	ops, err := operations(h)
	if err != nil {
		fail(err)
	}
	model := porcupine.Model{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byConversation := map[string][]porcupine.Operation{}
			for _, op := range history {
				c := op.Metadata.(string)
				byConversation[c] = append(byConversation[c], op)
			}
			names := make([]string, 0, len(byConversation))
			for c := range byConversation {
				names = append(names, c)
			}
			sort.Strings(names)
			out := make([][]porcupine.Operation, 0, len(names))
			for _, c := range names {
				out = append(out, byConversation[c])
			}
			return out
		},
		Init:              func() interface{} { return state{} },
		Step:              step,
		DescribeOperation: describeOperation,
		DescribeState:     describeState,
	}
	// Each conversation starts from its own base seq: check one partition at a time with an
	// Init that knows it (Porcupine's Init takes no argument).
	summary := map[string]interface{}{"operations": len(ops), "conversations": len(h.Conversations)}
	bad := []string{}
	undecided := []string{}
	unknownAppends := 0
	for _, op := range ops {
		if op.Output.(output).unknown {
			unknownAppends++
		}
	}
	summary["unknown_appends"] = unknownAppends
	for _, part := range model.Partition(ops) {
		conversation := part[0].Metadata.(string)
		base := h.Conversations[conversation]
		m := model
		m.Partition = nil
		m.Init = func() interface{} { return state{base: base} }
		result, info := porcupine.CheckOperationsVerbose(m, part, *timeout)
		switch result {
		case porcupine.Illegal:
			bad = append(bad, conversation)
			if *htmlPath != "" && len(bad) == 1 {
				if err := porcupine.VisualizePath(m, info, *htmlPath); err != nil {
					fmt.Fprintln(os.Stderr, "visualization:", err)
				}
			}
		case porcupine.Unknown:
			undecided = append(undecided, conversation)
		}
	}
	summary["not_linearizable"] = bad
	summary["timed_out"] = undecided
	verdict := "linearizable"
	code := 0
	if len(bad) > 0 {
		verdict, code = "not linearizable", 1
	} else if len(undecided) > 0 {
		verdict, code = "unknown (timed out)", 2
	}
	summary["verdict"] = verdict
	encoded, _ := json.Marshal(summary)
	fmt.Println(string(encoded))
	os.Exit(code)
}

// operations turns recorded operations into Porcupine's, checking each is well formed.
func operations(h History) ([]porcupine.Operation, error) {
	var end int64
	for _, r := range h.Operations {
		if r.Call > end {
			end = r.Call
		}
		if r.Return != nil && *r.Return > end {
			end = *r.Return
		}
	}
	out := make([]porcupine.Operation, 0, len(h.Operations))
	for n, r := range h.Operations {
		if _, ok := h.Conversations[r.Conversation]; !ok {
			return nil, fmt.Errorf("operation %d: unknown conversation %q", n, r.Conversation)
		}
		in := input{op: r.Op, key: r.Key, attempt: r.Attempt, status: r.Status}
		o := output{}
		ret := end + 1 // open until the end of the history
		switch r.Op {
		case "append":
			if r.Key == "" || strings.Contains(r.Key, "\n") {
				return nil, fmt.Errorf("operation %d: an append needs a key without newlines", n)
			}
			if r.Return == nil {
				o.unknown = true
			} else {
				o.seq = r.Seq
			}
		case "read":
			if r.Return == nil || len(r.Keys) != len(r.Seqs) {
				return nil, fmt.Errorf("operation %d: a read needs a return time and one seq per key", n)
			}
			o.keys, o.seqs = r.Keys, r.Seqs
		case "last":
			if r.Return == nil {
				return nil, fmt.Errorf("operation %d: a read needs a return time", n)
			}
			o.lastSeq = r.LastSeq
		case "effect":
			if r.Attempt == "" || strings.ContainsAny(r.Attempt, "\n:") ||
				(r.Status != "committed" && r.Status != "failed") {
				return nil, fmt.Errorf("operation %d: an effect needs an attempt and a status", n)
			}
			if r.Return == nil {
				o.unknown = true
			} else {
				o.seq, o.conflict, o.noAttempt = r.Seq, r.Conflict, r.NoAttempt
			}
		case "status":
			if r.Return == nil || r.Attempt == "" {
				return nil, fmt.Errorf("operation %d: a status read needs an attempt and a return time", n)
			}
			o.state = r.State
		default:
			return nil, fmt.Errorf("operation %d: unknown op %q", n, r.Op)
		}
		if r.Return != nil {
			ret = *r.Return
			if ret < r.Call {
				return nil, fmt.Errorf("operation %d returns before its call", n)
			}
		}
		if ret == math.MaxInt64 {
			return nil, fmt.Errorf("operation %d: time out of range", n)
		}
		out = append(out, porcupine.Operation{
			ClientId: r.Client, Input: in, Call: r.Call, Output: o, Return: ret,
			Metadata: r.Conversation,
		})
	}
	return out, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "lincheck:", err)
	os.Exit(2)
}
