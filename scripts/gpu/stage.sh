#!/usr/bin/env bash
# On the GPU machine: takes one call folder of the bundle (scripts/gpu/bundle.sh), checks its files
# against the MANIFEST and moves them outside the repo ($PRIME_GPU_STAGE, default /opt/prime-gpu),
# where the next call's transfer cannot remove them. Once every part is staged, unpacks them
# (each once) and links them into the repo: node_modules/, tools/bin/temporal, dist/ (copied:
# the code finds the project root from its own location). Idempotent; safe to repeat.
#   bash scripts/gpu/stage.sh .gpu/call-N
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
STAGE=${PRIME_GPU_STAGE:-/opt/prime-gpu}
log() { printf '\033[1m[gpu-stage]\033[0m %s\n' "$*"; }
die() { echo "gpu-stage: $*" >&2; exit 1; }

src=${1:?usage: stage.sh .gpu/call-N}
[ -f "$src/MANIFEST" ] || die "$src/MANIFEST not found: carry the call folder that scripts/gpu/bundle.sh wrote"
mkdir -p "$STAGE/parts"
cp "$src/MANIFEST" "$STAGE/MANIFEST.new"
# A manifest of another bundle invalidates what is staged.
if [ -f "$STAGE/MANIFEST" ] && ! cmp -s "$STAGE/MANIFEST" "$STAGE/MANIFEST.new"; then
  log "a new bundle: dropping the parts of the previous one"
  rm -rf "$STAGE/parts" && mkdir -p "$STAGE/parts"
fi
mv "$STAGE/MANIFEST.new" "$STAGE/MANIFEST"

while read -r sha call file; do
  [ -f "$src/$file" ] || continue
  [ "$(sha256sum "$src/$file" | cut -d' ' -f1)" = "$sha" ] || die "$src/$file: checksum mismatch (transfer broke?)"
  cp "$src/$file" "$STAGE/parts/.$file.tmp" && mv "$STAGE/parts/.$file.tmp" "$STAGE/parts/$file"
  log "staged $file (call $call)"
done < "$STAGE/MANIFEST"

# Unpack every complete part not yet unpacked at this checksum. A part split over calls is
# NAME.tar.xz.pieceNN; it is complete when all its pieces are staged.
missing=()
for name in $(awk '{print $3}' "$STAGE/MANIFEST" | sed 's/\.tar\.xz.*//' | sort -u); do
  files=$(awk -v n="$name" '$3 == n".tar.xz" || index($3, n".tar.xz.piece") == 1 {print $3}' "$STAGE/MANIFEST" | sort)
  key=$(awk -v n="$name" '$3 == n".tar.xz" || index($3, n".tar.xz.piece") == 1 {print $1}' "$STAGE/MANIFEST" | sort | sha256sum | cut -c1-16)
  complete=1
  for f in $files; do [ -f "$STAGE/parts/$f" ] || complete=; done
  if [ -z "$complete" ]; then
    missing+=("$name (call $(awk -v n="$name" 'index($3, n".tar.xz") == 1 {print $2; exit}' "$STAGE/MANIFEST"))")
    continue
  fi
  if [ "$(cat "$STAGE/$name.key" 2>/dev/null)" != "$key" ]; then
    log "unpacking $name"
    rm -rf "$STAGE/.$name.tmp" && mkdir -p "$STAGE/.$name.tmp"
    (cd "$STAGE/parts" && cat $files) | xz -dc | tar -C "$STAGE/.$name.tmp" -xf -
    rm -rf "$STAGE/$name" && mv "$STAGE/.$name.tmp" "$STAGE/$name"
    echo "$key" > "$STAGE/$name.key"
  fi
done

# Into the repo (all ignored by git there).
link() { # link TARGET PATH: PATH -> TARGET, replacing an earlier link (never a real folder).
  if [ -e "$2" ] && [ ! -L "$2" ]; then
    log "keeping the existing $2 (not a link)"
    return
  fi
  mkdir -p "$(dirname "$2")" && ln -sfn "$1" "$2"
}
[ -d "$STAGE/packages" ] && link "$STAGE/packages/node_modules" node_modules
[ -d "$STAGE/temporal" ] && link "$STAGE/temporal/temporal" tools/bin/temporal
if [ -d "$STAGE/dist" ]; then
  rm -rf dist.tmp && cp -r "$STAGE/dist/dist" dist.tmp && rm -rf dist && mv dist.tmp dist
fi
[ -d "$STAGE/node" ] && echo "export PATH=$STAGE/node/bin:\$PATH PRIME_NODE_INCLUDE=$STAGE/node/include/node" > "$STAGE/env.sh"

if [ ${#missing[@]} -gt 0 ]; then
  log "not staged yet: ${missing[*]}"
else
  log "all parts staged in $STAGE"
fi
