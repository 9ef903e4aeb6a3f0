#!/bin/sh
# Build a local base image, luftpause-base:local by default, from Debian packages, for a machine
# that cannot pull python:3.11-slim (no registry reachable) but reaches a Debian mirror:
#
#   deploy/docker/base/build-base.sh [IMAGE]
#   make images BASE_IMAGE=luftpause-base:local
#
# mmdebstrap bootstraps the host's own Debian release (suite from /etc/os-release, mirrors from
# the host's apt sources: the suite, its -updates and, when listed, its -security) with python3, python3-venv, ca-certificates, passwd (useradd) and
# libgomp1 (llama.cpp); the host's extra CA certificates (/usr/local/share/ca-certificates/*.crt)
# are added to its bundle; `docker import` makes the image. Its python3 is /usr/bin/python3; the
# Dockerfiles use whichever python3 is first on PATH, so they build on it and on the official
# image alike. Does nothing when the image exists already. Needs root, mmdebstrap and docker
# (`make docker-tools`). Overrides: DOCKER, SUITE, MIRROR, SECURITY_MIRROR, CA_DIR.
set -eu

IMAGE=${1:-luftpause-base:local}
DOCKER=${DOCKER:-docker}
CA_DIR=${CA_DIR:-/usr/local/share/ca-certificates}
PACKAGES=python3,python3-venv,ca-certificates,passwd,libgomp1

if "$DOCKER" image inspect "$IMAGE" > /dev/null 2>&1; then
    echo "$IMAGE exists"
    exit 0
fi

# The first URI of the host's apt sources that serves $1 (deb822 .sources, then one-line .list).
mirror_for() {
    for file in /etc/apt/sources.list.d/*.sources; do
        [ -f "$file" ] || continue
        awk -v want="$1" '
            /^[[:space:]]*$/ { if (uri && hit) { print uri; exit } uri = ""; hit = 0; next }
            $1 == "URIs:" { uri = $2 }
            $1 == "Suites:" { for (i = 2; i <= NF; i++) if ($i == want) hit = 1 }
            END { if (uri && hit) print uri }
        ' "$file" | head -n 1
    done
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$file" ] || continue
        awk -v want="$1" '$1 == "deb" && $3 == want { print $2; exit }' "$file"
    done
}

. /etc/os-release
SUITE=${SUITE:-${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release: set SUITE}}
MIRROR=${MIRROR:-$(mirror_for "$SUITE" | head -n 1)}
if [ -z "$MIRROR" ]; then
    echo "no apt source for $SUITE on this host: set MIRROR to a Debian mirror's URL" >&2
    exit 1
fi
SECURITY_MIRROR=${SECURITY_MIRROR:-$(mirror_for "$SUITE-security" | head -n 1)}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/ca"
for crt in "$CA_DIR"/*.crt; do
    [ -f "$crt" ] && cp "$crt" "$work/ca/"
done

set -- "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main"
if [ -n "$SECURITY_MIRROR" ]; then
    set -- "$@" "deb $SECURITY_MIRROR $SUITE-security main"
fi

echo "bootstrapping Debian $SUITE from $MIRROR into $IMAGE"
mmdebstrap --mode=root --variant=minbase --include="$PACKAGES" \
    --customize-hook="sync-in $work/ca /usr/local/share/ca-certificates" \
    --customize-hook='chroot "$1" update-ca-certificates' \
    "$SUITE" "$work/rootfs.tar" "$@"

"$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$work/rootfs.tar" "$IMAGE"
echo "built $IMAGE"
