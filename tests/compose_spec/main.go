// Command compose_spec loads a Compose file with the Compose specification's own loader
// (compose-go, the library docker compose itself uses) and prints the normalized project as
// JSON: every anchor, merge key, default and short syntax resolved the way Docker would.
//
//	go run . docker-compose.yml > project.json
//
// Every profile is loaded, so services behind a profile are checked too. No variable comes
// from the environment: the file's own defaults apply, so the output depends on the file alone.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: compose_spec COMPOSE_FILE")
		os.Exit(2)
	}
	path, err := filepath.Abs(os.Args[1])
	if err != nil {
		fail(err)
	}
	options, err := cli.NewProjectOptions(
		[]string{path},
		cli.WithWorkingDirectory(filepath.Dir(path)),
		cli.WithProfiles([]string{"*"}),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		fail(err)
	}
	project, err := options.LoadProject(context.Background())
	if err != nil {
		fail(err)
	}
	out, err := project.MarshalJSON()
	if err != nil {
		fail(err)
	}
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "compose_spec:", err)
	os.Exit(1)
}
