"""docker-compose.yml as Docker reads it: ``loader`` builds and runs the Go program beside this
file (``main.go``), which loads the file with compose-go, the Compose specification's own
loader (the library inside ``docker compose``), and prints the normalized project: anchors,
merge keys, short syntax and defaults resolved as Docker resolves them, so a test asserts on
what would run, not on YAML text. No Docker engine needed.
"""
