"""Container images built by hack/build-image.sh (podman, cached by hash), as tarballs a node imports.

    image = build_image()                                  # this checkout's Dockerfile
    old = build_image(source=tree, tag="localhost/dbprovider:0.1.0")   # any tree, e.g. a git archive
    pause = build_image(pause=True)                        # the pod sandbox image (catatonit)

A cached image returns in a second or two; a cold one takes about 1.5 minutes (the Debian base one
more). When hack/late-builds.sh builds it in the background (CI), this waits for it, and stops at once
if that build failed.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.process import wait_for_late_build

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-image.sh"


@dataclass(frozen=True)
class Image:
    tag: str  # e.g. localhost/dbprovider:3f1c0a9e12ab
    tarball: Path  # docker-archive, for `ctr images import`


def build_image(source: Path | None = None, tag: str | None = None, *, pause: bool = False) -> Image:
    """Run hack/build-image.sh (cached) and return the image's tag and tarball."""
    argv = ["bash", str(BUILD_SCRIPT)]
    if pause:
        argv.append("--pause")
    if source is not None:
        argv += ["--source", str(source)]
    if tag is not None:
        argv += ["--tag", tag]
    if source is None and tag is None:  # hack/late-builds.sh's own images: stop at once if they failed there
        wait_for_late_build("pause" if pause else "image", argv)
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    tag_line, tarball = result.stdout.strip().splitlines()[-2:]
    return Image(tag_line, Path(tarball))
