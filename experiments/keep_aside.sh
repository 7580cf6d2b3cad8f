# Sourced by the experiment scripts: `keep_aside DIR` moves a cut run's folder to DIR.cut-<time>
# (its steps would not match the others', so it starts over) and never deletes it.
keep_aside() {
  [[ -e "$1" ]] || return 0
  local aside
  aside="$1.cut-$(date +%Y%m%d-%H%M%S)"
  mv "$1" "$aside"
  echo "a cut run moved to $aside" >&2
}
