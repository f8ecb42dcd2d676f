#!/usr/bin/env bash
# tests/emu/layering_test.sh: proves the build refuses a wrong-direction #include.
#  1. scripts/check_layers.py passes on the real tree;
#  2. it fails, naming file, line and rule, on copies of the tree with one wrong include
#     planted per rule (objects->transport, transport->fault, fault->objects, wire->emu,
#     emu->verbs headers);
#  3. every object file of every layer library waits on its output (ninja order-only input),
#     so when the check fails nothing compiles.
# usage: layering_test.sh SOURCE_ROOT BUILD_DIR
set -uo pipefail
src=$1; build=$2
py=/usr/bin/python3
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

$py "$src/scripts/check_layers.py" --root "$src" || { echo "FAIL: the real tree does not pass"; fail=1; }

plant() {  # file-to-create include-line expected-substring
  rm -rf "$tmp/t"; mkdir -p "$tmp/t"
  cp -r "$src/base" "$src/wire" "$src/emu" "$src/tools" "$src/verbs_shim" "$tmp/t/"
  mkdir -p "$(dirname "$tmp/t/$1")"
  printf '// planted by layering_test\n#include %s\n' "$2" >> "$tmp/t/$1"
  if out=$($py "$src/scripts/check_layers.py" --root "$tmp/t" 2>&1); then
    echo "FAIL: $1 including $2 was accepted"; fail=1
  elif ! grep -q "$3" <<<"$out"; then
    echo "FAIL: $1 including $2: message does not name it: $out"; fail=1
  else
    echo "ok: refused: $out"
  fi
}
plant emu/objects/qp.h '"emu/transport/engine.h"' 'emu/objects/qp.h:.*must not include "emu/transport/engine.h"'
plant emu/transport/req.cc '"emu/fault/fault.h"' 'emu/transport/req.cc:.*must not include "emu/fault/fault.h"'
plant emu/fault/fault.cc '"emu/objects/qp.h"' 'emu/fault/fault.cc:.*must not include "emu/objects/qp.h"'
plant base/log.h '"wire/packet.h"' 'base/log.h:.*must not include "wire/packet.h"'
plant wire/packet.h '"emu/objects/types.h"' 'wire/packet.h:.*must not include'
plant emu/objects/new_file.cc '<infiniband/verbs.h>' 'must not include <infiniband/verbs.h>'
plant emu/services/services.cc '"verbs_shim/shim.h"' 'must not include "verbs_shim/shim.h"'

# The build rule: each layer library's objects depend on the check.
for lib in base/libbase.a wire/libwire.a emu/objects/libemu_objects.a emu/transport/libemu_transport.a \
           emu/fault/libemu_fault.a emu/cm/libemu_cm.a emu/services/libemu_services.a; do
  objs=$(ninja -C "$build" -t query "$lib" 2>/dev/null | sed -n '/input:/,/outputs:/p' | grep '\.o$' | tr -d ' ')
  [ -n "$objs" ] || { echo "FAIL: no objects found for $lib"; fail=1; continue; }
  for o in $objs; do
    q=$(ninja -C "$build" -t query "$o" 2>&1)
    if ! grep -q "layer_check.h" <<<"$q"; then
      echo "FAIL: $o does not wait on layer_check"; fail=1
    fi
  done
  echo "ok: $lib: $(wc -w <<<"$objs") objects wait on layer_check"
done
# The README's folders table names every source folder (top level and emu/'s layers) and only
# folders that exist.
readme_dirs=$(sed -n '/^## Folders/,/^## /p' "$src/README.md" | grep -o '^| `[a-z_/]*/`' | sed 's/^| `//; s/`$//; s,/$,,' | sort)
tree_dirs=$( (cd "$src" && for d in */ emu/*/; do d=${d%/}; case $d in build*|emu) continue;; esac; echo "$d"; done) | sort)
if [ "$readme_dirs" != "$tree_dirs" ]; then
  echo "FAIL: README folders table != tree:"; diff <(echo "$readme_dirs") <(echo "$tree_dirs"); fail=1
else
  echo "ok: README folders table lists: $(echo $readme_dirs)"
fi
exit $fail
