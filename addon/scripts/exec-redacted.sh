#!/bin/sh
# exec-redacted.sh PROGRAM [ARG...]: runs PROGRAM in place of this shell, so that it is still the process the
# container's signals reach, with its stdout and stderr passed through a filter on their way to the container log.
# The filter blanks the value of PIKA_PASSWORD wherever it appears, and whatever follows a password setting's name:
# pika prints its whole config at start (requirepass, masterauth, userpass), and codis-dashboard and codis-proxy log
# `option --product_auth = ...` and their config (product_auth, session_auth).
set -eu
[ "$#" -ge 1 ] || { echo "usage: exec-redacted.sh PROGRAM [ARG...]" >&2; exit 2; }

output="$(mktemp -u "${TMPDIR:-/tmp}/redacted-output.XXXXXX")"
mkfifo -m 600 "$output"
(
  # Once PROGRAM has opened the pipe, its name can go; the filter ends when PROGRAM's output closes.
  exec <"$output"
  rm -f "$output"
  exec awk '
    function blank(line, secret,    at, out) {
      if (secret == "") return line
      out = ""
      while ((at = index(line, secret)) > 0) {
        out = out substr(line, 1, at - 1) "<redacted>"
        line = substr(line, at + length(secret))
      }
      return out line
    }
    {
      line = blank($0, ENVIRON["PIKA_PASSWORD"])
      if (match(line, /(requirepass|masterauth|userpass|product_auth|session_auth)[ \t]*[:=]?[ \t]*/))
        line = substr(line, 1, RSTART + RLENGTH - 1) "<redacted>"
      print line
      fflush()
    }
  '
) &
exec "$@" >"$output" 2>&1
