#!/usr/bin/env bash
# The runbook's ./setup.sh (run inside the clone): deploy/setup.sh, run as is.
case "${BASH_SOURCE[0]}" in */*) dir="${BASH_SOURCE[0]%/*}" ;; *) dir=. ;; esac
exec "$BASH" "$dir/deploy/setup.sh" "$@"
