#!/bin/sh
# Run a command (pip, apt-get) trusting extra CA certificates from the build secret `ca`,
# when one was given:  docker build --secret id=ca,src=/path/to/extra-ca.pem ...
# Needed behind a TLS-inspecting proxy (pip otherwise fails with CERTIFICATE_VERIFY_FAILED).
# The certificates live in a temporary file for this command only: none stays in the image.
set -e
if [ -s /run/secrets/ca ]; then
    bundle=$(mktemp)
    cat /etc/ssl/certs/ca-certificates.crt /run/secrets/ca >"$bundle"
    export PIP_CERT="$bundle" SSL_CERT_FILE="$bundle" REQUESTS_CA_BUNDLE="$bundle"
fi
status=0
"$@" || status=$?
[ -z "${bundle:-}" ] || rm -f "$bundle"
exit "$status"
