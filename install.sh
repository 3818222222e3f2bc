#!/usr/bin/env bash
# The runbook's installer path (./provider-node/install.sh from the parent of
# a clone named provider-node): the installer is deploy/install.sh, run as is.
case "${BASH_SOURCE[0]}" in */*) dir="${BASH_SOURCE[0]%/*}" ;; *) dir=. ;; esac
exec "$BASH" "$dir/deploy/install.sh" "$@"
