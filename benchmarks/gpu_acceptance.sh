#!/usr/bin/env bash
exec "$(dirname "$0")/gpu.sh" acceptance "$@"
