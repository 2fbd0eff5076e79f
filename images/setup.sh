#!/usr/bin/env bash
# Install what `make images` and the container e2e need, when it is missing: podman and
# buildah (the images' builds and the pods' containers), runc (the OCI runtime that works on
# cgroup v1 hosts), mmdebstrap (the locally made base image). Debian's packages; run as root
# (CI is). A second run only checks the commands (milliseconds).
set -euo pipefail
need=()
for pair in podman:podman buildah:buildah runc:runc mmdebstrap:mmdebstrap newuidmap:uidmap; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if (( ${#need[@]} == 0 )); then
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "[images-setup] missing: ${need[*]}; run as root or: apt-get install ${need[*]}" >&2
  exit 1
fi
echo "[images-setup] installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q "${need[@]}" >/dev/null
