#!/bin/sh
# Makes the base image the container-image test builds on, without a registry: Debian 12
# (bookworm) from deb.debian.org by debootstrap, imported into podman's storage as IMAGE
# (default localhost/idemgate-base:bookworm). Cached twice so that a second run is quick: the
# root filesystem tarball under CACHE (default .cache/image/, git-ignored) and the image in
# podman's own storage; a run with both present does nothing. Needs root (debootstrap,
# podman as root); installs podman and debootstrap with apt-get when missing.
#   scripts/image-base.sh [IMAGE]      prints IMAGE
#
# The shipped docker/Dockerfile pins debian:12.12-slim by digest; this image stands in for it
# only in tests/integration/test_image.py, which builds from a copy whose FROM lines name it.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IMAGE=${1:-localhost/idemgate-base:bookworm}
CACHE=${IDEMGATE_IMAGE_CACHE:-$ROOT/.cache/image}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TARBALL=$CACHE/bookworm-minbase.tar

[ "$(id -u)" -eq 0 ] || { echo "image-base: needs root (debootstrap, podman)" >&2; exit 1; }
"$ROOT/scripts/image-deps.sh" >&2

if podman image exists "$IMAGE"; then
    echo "$IMAGE"
    exit 0
fi
if [ ! -s "$TARBALL" ]; then
    mkdir -p "$CACHE"
    rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    echo "image-base: debootstrap bookworm from $MIRROR into $rootfs" >&2
    debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >&2
    # What the official slim image has and debootstrap leaves behind: no package lists, no
    # apt cache, no resolver configuration of the build host.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
    : > "$rootfs/etc/resolv.conf"
    : > "$rootfs/etc/hostname"
    tar --numeric-owner -C "$rootfs" -cf "$TARBALL.tmp" .
    mv "$TARBALL.tmp" "$TARBALL"
fi
echo "image-base: importing $TARBALL as $IMAGE" >&2
podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    "$TARBALL" "$IMAGE" >&2
echo "$IMAGE"
