import sys

try:
    from headstart.cli import main
except KeyboardInterrupt:  # Ctrl-C while the CLI itself is imported: no traceback either
    print("interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
