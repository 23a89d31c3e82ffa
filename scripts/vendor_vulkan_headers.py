#!/usr/bin/env python3
"""Rebuild third_party/vulkan-headers from Debian 13's libvulkan-dev package.

    python scripts/vendor_vulkan_headers.py            # download the pinned .deb
    python scripts/vendor_vulkan_headers.py --deb F    # use a .deb already on disk

Why: ggml's Vulkan backend (ggml-vulkan.cpp) uses vk::LayerSettingEXT without a
version guard, which Debian 12's Vulkan headers (1.3.239) lack.  Only the
headers are taken (the Khronos Vulkan-Headers, as Debian packages them); the
loader, glslc and the SPIR-V headers still come from the build machine
(Debian 12: libvulkan-dev glslc spirv-headers).  The .deb's sha256 is checked
before anything is copied; the files are copied unmodified.

They are kept as one reproducible tarball (18 MB of headers, 1.5 MB packed):
cmake/vulkan.cmake unpacks it into the build folder.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import lzma
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

PIN_VERSION = "1.4.309.0-1"
PIN_URL = f"http://deb.debian.org/debian/pool/main/v/vulkan-loader/libvulkan-dev_{PIN_VERSION}_amd64.deb"
PIN_SHA256 = "8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a"
KEPT = ("usr/include/vulkan/", "usr/include/vk_video/", "usr/share/doc/libvulkan-dev/copyright")

ROOT = Path(__file__).resolve().parent.parent
TARBALL = "include.tar.xz"
DEST = ROOT / "third_party" / "vulkan-headers"


def ar_members(data: bytes):
    """The members of a Unix ar archive (a .deb is one): (name, bytes)."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        yield name, data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)


def write_tarball(usr: Path, target: Path) -> None:
    """include/vulkan and include/vk_video, in name order, with fixed owners and times:
    the same .deb gives the same bytes."""
    def normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        info.mode = 0o755 if info.isdir() else 0o644
        return info

    with tarfile.open(target, "w:xz", format=tarfile.PAX_FORMAT) as tar:
        paths = sorted(p for sub in ("vulkan", "vk_video") for p in (usr / "include" / sub).rglob("*"))
        for sub in ("vulkan", "vk_video"):
            tar.add(usr / "include" / sub, arcname=f"include/{sub}", recursive=False, filter=normalized)
        for path in paths:
            tar.add(path, arcname=str(path.relative_to(usr)), recursive=False, filter=normalized)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deb", type=Path, help="a local copy of the pinned .deb")
    args = ap.parse_args()
    data = args.deb.read_bytes() if args.deb else urllib.request.urlopen(PIN_URL, timeout=120).read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != PIN_SHA256:
        print(f"sha256 mismatch: {digest} != {PIN_SHA256}", file=sys.stderr)
        return 1
    (payload,) = [blob for name, blob in ar_members(data) if name.startswith("data.tar")]
    if not payload.startswith(b"\xfd7zXZ"):
        print("expected an xz-compressed data.tar in the .deb", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(lzma.decompress(payload))) as tar:
            members = [m for m in tar.getmembers()
                       if m.isfile() and m.name.lstrip("./").startswith(KEPT)]
            tar.extractall(tmp, members=members, filter="data")
        usr = Path(tmp) / "usr"
        if DEST.exists():
            shutil.rmtree(DEST)
        DEST.mkdir(parents=True)
        write_tarball(usr, DEST / TARBALL)
        shutil.copy2(usr / "share" / "doc" / "libvulkan-dev" / "copyright", DEST / "LICENSE")
    (DEST / "ORIGIN.md").write_text(f"""# Vendored Vulkan headers

The Khronos Vulkan-Headers {PIN_VERSION.split('-')[0]}, as Debian 13 (trixie) packages them in
`libvulkan-dev {PIN_VERSION}`, copied unmodified: `include/vulkan/` and `include/vk_video/`,
packed as `{TARBALL}` (cmake/vulkan.cmake unpacks it into the build folder).

- package: {PIN_URL}
- sha256: `{PIN_SHA256}`
- licence: `LICENSE`, Debian's copyright file from the same package (the headers: Apache-2.0)

Why: ggml's Vulkan backend uses `vk::LayerSettingEXT` unguarded, and Debian 12's headers
(1.3.239) lack it. `ELELEM_VULKAN=1` builds point CMake's `Vulkan_INCLUDE_DIR` here
(cmake/vulkan.cmake); the loader library, `glslc` and the SPIR-V headers come from the
build machine.

Rebuild: `python scripts/vendor_vulkan_headers.py`.
""")
    print(f"vendored Vulkan headers {PIN_VERSION} into {DEST.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
