#!/usr/bin/env bash
# Every field of configs/kiln.proto changes what a run does (tests/train/settings_act.py).
source "$(dirname "$0")/lib.sh"
python3 "$SRC/tests/train/settings_act.py" "$KILN" "$SRC" "$WORK"
