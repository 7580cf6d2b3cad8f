import sys

try:
    from headstart.cli import console
except KeyboardInterrupt:  # Ctrl-C while the CLI itself is imported: no traceback either
    print("interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(console())
